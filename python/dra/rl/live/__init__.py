"""The live RL loop (docs/guide/rl.md, "Live"): real GRPO post-training on device slots with hard CPU
quotas, rollout and trainer roles switched in place at step boundaries.

- ``task``: the verifiable task (answer length set by the prompt, heavy-tailed from the Azure trace)
- ``model``: the small transformer policy and its continuous-batching rollout engine
- ``pretrain``: the supervised warm-up every run starts from
- ``slots``: cgroups v1 CPU slots
- ``worker``: the process on one slot; ``coordinator``: the pipeline, the ledger, the switches
- ``bench``: the measured rows of ``python -m dra.bench rl --live``

Importing this package imports torch.
"""
