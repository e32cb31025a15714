"""The live RL loop (docs/guide/rl.md, "Live"): real GRPO post-training on device slots with hard CPU
quotas, rollout and trainer roles switched in place at step boundaries.

- ``task``: the verifiable task (answer length set by the prompt, heavy-tailed from the Azure trace)
- ``model``: the small transformer policy and its continuous-batching rollout engine
- ``pretrain``: the supervised warm-up every run starts from
- CPU slots are the device pool's (``dra.pool._cgroup``: cgroups v1, a hard quota per slot)
- ``config``: the settings (``LiveConfig``) and the task's length workloads
- ``worker``: the process on one slot; ``coordinator``: the slots and the phase-by-phase pipeline;
  ``pipeline``: the pipeline without a per-phase barrier (devices moved inside a step);
  ``processes``: starting a worker in its slot, leftovers of killed runs, which worker failed;
  ``cli``: the command line (``python -m dra.rl.live.coordinator``)

The measured rows of ``python -m dra.bench rl --live`` are benchmark code: benchmarks/dra_bench/_rl_live.py.

Importing this package imports torch.
"""
