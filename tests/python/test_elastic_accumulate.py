"""Gradient accumulation in an elastic job, DDP's recipe (``with model.no_sync():`` around every
backward of a window but the last): one committed step per window, every sample trained exactly
once through grows, shrinks, a kill and DataLoader prefetching, and the same update as one
process training on the window's samples."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _elastic_harness import Job, check_exactly_once

WORKER = Path(__file__).resolve().parent / "elastic_workers" / "accumulate_worker.py"
pytestmark = pytest.mark.timeout(300)
N, B, K = 150, 4, 3


def _start_all(job: Job) -> None:
    for r in range(job.nproc):
        job.start(f"r{r}", RANK=r, worker=WORKER)


def _finals(job: Job) -> dict[int, dict]:
    return {r["uid"]: r for r in job.records("final")}


def test_alone_each_window_is_one_step_and_every_sample_is_trained_once(tmp_path):
    # One process, no loader workers, dra.step called after every micro-batch as well: those
    # commit nothing. 150 samples in batches of 4: 38 batches, 13 windows per epoch.
    job = Job(tmp_path, 1, epochs=2, dataset_size=N, batch_size=B, accumulate=K, workers=0, step_every_batch=True)
    job.start("r0", RANK=0, worker=WORKER)
    codes = job.wait(120)
    assert codes == {"r0": 0}, job.output("r0")[-3000:]
    check_exactly_once(job, N, 2)
    assert _finals(job)[0]["step"] == 2 * -(-38 // K)
    assert "never followed by a reducing backward" not in job.output("r0")


def test_two_ranks_take_the_update_one_process_takes_on_the_windows_samples(tmp_path):
    # A fixed world of 2 with loader workers: per window, the update is the mean of the K steps'
    # losses (each divided by K, as the script does) over all their samples, as on one process.
    job = Job(tmp_path, 2, epochs=1, dataset_size=N, batch_size=B, accumulate=K, workers=2, momentum=0.0)
    _start_all(job)
    codes = job.wait(180)
    assert codes == {"r0": 0, "r1": 0}, [job.output(n)[-3000:] for n in codes]
    check_exactly_once(job, N, 1)
    finals = _finals(job)
    assert finals[0]["digest"] == finals[1]["digest"]

    gen = torch.Generator().manual_seed(7)
    x = torch.randn(N, 8, generator=gen)
    y = x @ torch.randn(8, 1, generator=gen)
    torch.manual_seed(0)  # the first world starts from process 0's model
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    order = torch.randperm(N, generator=torch.Generator().manual_seed(5))  # torch's order, seed + epoch
    g = 2 * B
    steps = [order[i:i + g] for i in range(0, N, g)]
    for w in range(0, len(steps), K):
        opt.zero_grad()
        for ids in steps[w:w + K]:
            # Each rank's loss is the mean over its half; the world weighs the halves by their sizes.
            halves = [ids[r::2] for r in range(2)]
            loss = sum(len(h) / len(ids) * torch.nn.functional.mse_loss(model(x[h]), y[h]) for h in halves) / K
            loss.backward()
        opt.step()
    want = [p.detach().flatten() for p in model.parameters()]
    got = [torch.tensor(v) for v in finals[0]["params"]]
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


def test_grow_shrink_and_a_kill_mid_window_keep_every_sample_once(tmp_path):
    # 3 processes, 2 to start; grow at step 2; process 2 dies after its reduction of step 5 and
    # before its commit: the survivors shrink and redo that window; shrink to 1 at step 8. Loader
    # workers prefetch batches that a world change then makes stale, inside windows too.
    job = Job(tmp_path, 3, start_size=2, schedule={"2": 3, "8": 1}, epochs=2, dataset_size=N, batch_size=B,
              accumulate=K, workers=2, prefetch=2, die_at={"2": 5}, fault_timeout_s=3.0)
    _start_all(job)
    codes = job.wait(240)
    assert codes == {"r0": 0, "r1": 0, "r2": 9}, [job.output(n)[-3000:] for n in codes]
    check_exactly_once(job, N, 2)
    events = [(e["event"], e.get("after")) for e in job.events()]
    assert [ev for ev in events if ev[0] in ("start", "resize", "fault")] == [
        ("start", 2), ("resize", 3), ("fault", 2), ("resize", 1)], events
    assert all(e["params_identical"] for e in job.events() if e.get("params_identical") is not None)


def test_accumulating_without_no_sync_is_refused_by_name_on_every_rank(tmp_path):
    # Every backward reduces and dra.step comes once per window: a second reduced gradient would be
    # added to one the world already counted as a step. Both ranks stop at once with the recipe.
    job = Job(tmp_path, 2, epochs=1, dataset_size=60, batch_size=B, accumulate=K, workers=0, no_sync=False)
    _start_all(job)
    codes = job.wait(90)
    assert codes == {"r0": 1, "r1": 1}, [job.output(n)[-2000:] for n in codes]
    for name in codes:
        assert "gradient accumulation without no_sync()" in job.output(name)
        assert "with model.no_sync():" in job.output(name)


def test_accumulating_over_committed_steps_warns_once(tmp_path):
    # dra.step after every batch but the optimizer every K batches, without no_sync: each batch is
    # its own committed step (exactly once still holds); the user is told what a failure would cost.
    job = Job(tmp_path, 1, epochs=1, dataset_size=60, batch_size=B, accumulate=K, workers=0, no_sync=False,
              step_every_batch=True)
    _start_all(job)
    codes = job.wait(90)
    assert codes == {"r0": 0}, job.output("r0")[-2000:]
    assert job.output("r0").count("gradients accumulate over several dra.step calls") == 1


@pytest.mark.parametrize("broadcast", [True, False])
def test_batch_norm_buffers_are_the_worlds_mean_at_every_step_unless_turned_off(tmp_path, broadcast):
    # A BatchNorm model, 3 processes (2, then 3 from step 3), each rank's running statistics
    # following its own batches: averaged at every committed step (DDP's default), the ranks hold
    # identical state at every world change and at the end; turned off, they do not.
    job = Job(tmp_path, 3, start_size=2, schedule={"3": 3}, epochs=1, dataset_size=96, batch_size=B, accumulate=1,
              workers=0, batch_norm=True, broadcast_buffers=broadcast)
    _start_all(job)
    codes = job.wait(180)
    assert codes == {"r0": 0, "r1": 0, "r2": 0}, [job.output(n)[-2000:] for n in codes]
    check_exactly_once(job, 96, 1)
    digests = {r["digest"] for r in _finals(job).values()}
    grow = [e for e in job.events() if e["event"] == "resize"]
    if broadcast:
        assert len(digests) == 1 and grow[0]["params_identical"] is True
    else:
        assert len(digests) == 3 and grow[0]["params_identical"] is False


def test_a_grow_near_an_epochs_end_with_prefetching_loaders_keeps_the_windows_aligned(tmp_path):
    # A window of 5 that does not divide the epoch (141 samples, 36 batches per pass at world 2's
    # launch size), loader workers prefetching, a grow at step 1 and a shrink at step 4 over 3
    # epochs: the batches a world change makes stale never reach the loop, so its own counters
    # (`(i + 1) % accum`, `i + 1 == len(loader)`) agree on every rank and on the joiner.
    job = Job(tmp_path, 3, start_size=2, schedule={"1": 3, "4": 2}, epochs=3, dataset_size=141, batch_size=B,
              accumulate=5, workers=2, prefetch=2)
    _start_all(job)
    codes = job.wait(240)
    assert codes == {"r0": 0, "r1": 0, "r2": 0}, [job.output(n)[-3000:] for n in codes]
    check_exactly_once(job, 141, 3)
    assert all(e["params_identical"] for e in job.events() if e.get("params_identical") is not None)
    assert not [e for e in job.events() if e["event"] == "refused"], job.events()


def test_nanogpts_require_backward_grad_sync_accumulates_like_no_sync(tmp_path):
    job = Job(tmp_path, 2, epochs=1, dataset_size=N, batch_size=B, accumulate=K, workers=2, momentum=0.0,
              flag_style=True)
    _start_all(job)
    codes = job.wait(180)
    assert codes == {"r0": 0, "r1": 0}, [job.output(n)[-3000:] for n in codes]
    check_exactly_once(job, N, 1)
    finals = _finals(job)
    assert finals[0]["digest"] == finals[1]["digest"] and finals[0]["step"] == -(-19 // K)


def test_accumulating_without_no_sync_is_refused_when_the_first_parameter_is_unused(tmp_path):
    # The unused parameter holds a zero gradient after a reduction: every parameter is looked at.
    job = Job(tmp_path, 2, epochs=1, dataset_size=60, batch_size=B, accumulate=K, workers=0, no_sync=False,
              unused_first=True)
    _start_all(job)
    codes = job.wait(90)
    assert codes == {"r0": 1, "r1": 1}, [job.output(n)[-2000:] for n in codes]
    assert all("gradient accumulation without no_sync()" in job.output(n) for n in codes)
