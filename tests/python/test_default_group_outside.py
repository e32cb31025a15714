"""torch's default process group under `dra run`, as an unmodified DDP script uses it: its own
``init_process_group()``, and at every data epoch's end ``dist.all_reduce`` of a per-rank tensor,
``dist.barrier()``, ``dist.all_gather_object`` and ``dist.broadcast_object_list``, and a save on
``dist.get_rank() == 0``. Real processes, real Gloo.

The default group spanned the launch world while dra trained over its own elastic one: the
collectives hung once a launched process stood by (a shrink) or was gone (a kill -9), and a
replacement started by ``dra run --max-restarts`` had a private world of one, whose sums disagreed
with the others'. Now the members re-create the default group over the world after every change
(docs/guide/elastic.md, "init_process_group / destroy_process_group"): each rank contributes 1 and
the sum is the world's size as dra sees it, ``dist.get_rank()`` is the elastic rank. A process
that stands by when the job ends keeps a group the members have left: it is warned, and its
collectives fail at once instead of hanging.

The script's Gloo timeout is short and the job's run bounded, so a hang fails fast.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _elastic_harness import run_logged_script

pytestmark = pytest.mark.timeout(150)

SCRIPT = r"""
import json, os, signal, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import dra, dra.elastic as de

cfg = json.loads(os.environ["CFG"])
kill = cfg.get("kill")  # [uid, step]: that process is killed -9 there
dist.init_process_group("gloo", timeout=timedelta(seconds=cfg.get("gloo_timeout_s", 8)))
LOG = open(os.path.join(cfg["out"], f"log-{os.getpid()}.jsonl"), "a")

def rec(**kw):
    LOG.write(json.dumps(kw) + "\n"); LOG.flush()

gen = torch.Generator().manual_seed(0)
x = torch.randn(cfg.get("n", 48), 4, generator=gen)
ds = TensorDataset(x, x @ torch.randn(4, 1, generator=gen))
torch.manual_seed(0)
net = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.05)
sampler = de.DistributedSampler(ds)
loader = DataLoader(ds, batch_size=4, sampler=sampler)
model = de.DistributedDataParallel(net, opt, sampler)
ctl = model.controller
for epoch in ctl.epochs(cfg.get("epochs", 6)):
    for xb, yb in loader:
        if [ctl.uid, ctl.step_index] == kill:
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad()
        loss = F.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
        dra.step(loss)
        if [ctl.uid, ctl.step_index] == cfg.get("kill_after"):  # after its dra.step, before the script's collectives
            os.kill(os.getpid(), signal.SIGKILL)
        if [ctl.uid, ctl.step_index] == cfg.get("raise_at"):  # nobody catches it
            raise RuntimeError("boom-uncaught")
        if cfg.get("per_step"):  # a script that logs the world's mean loss after every step
            each = torch.ones(1)
            if cfg.get("async_op"):
                dist.all_reduce(each, async_op=True).wait()
            else:
                dist.all_reduce(each)
            rec(step=ctl.step_index, uid=ctl.uid, step_sum=each.item(), world=ctl.world_size)
        time.sleep(cfg.get("step_sleep", 0.0))
    # The end of a data epoch, as a DDP script validates and saves.
    uids = [None] * dist.get_world_size()
    if cfg.get("objects_first"):  # the epoch's first collective is an object one (an all_gather inside)
        dist.all_gather_object(uids, ctl.uid)
    one = torch.ones(1)
    dist.all_reduce(one)
    dist.barrier()
    if not cfg.get("objects_first"):
        dist.all_gather_object(uids, ctl.uid)
    # A standby admitted again in a later data epoch ends the loader with the world: its loop
    # variable is behind, the sampler says where the world is.
    word = [f"epoch {sampler.epoch}" if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(word, src=0)
    if dist.get_rank() == 0:
        torch.save(net.state_dict(), os.path.join(cfg["out"], "ckpt.pt"))
    rec(hook=id(sys.excepthook), epoch=sampler.epoch, uid=ctl.uid, sum=one.item(), world=ctl.world_size, rank=dist.get_rank(), ctl_rank=ctl.rank,
        size=dist.get_world_size(), uids=uids, members=list(ctl.members), word=word[0])
dist.destroy_process_group()
rec(final=True, uid=ctl.uid, member=ctl.is_member)
"""


def _run(tmp_path: Path, options: dict, *launcher_args: str, **cfg) -> tuple[list[dict], str]:
    epochs, _, logs = _run_all(tmp_path, options, *launcher_args, **cfg)
    return epochs, logs


def _run_all(tmp_path: Path, options: dict, *launcher_args: str, nproc: int = 3, **cfg) -> tuple[list[dict], list[dict], str]:
    options = {"policy": "none", "fault_timeout_s": 3.0, **options}
    code, logs, records = run_logged_script(tmp_path, SCRIPT, nproc, options, cfg, timeout=90,
                                            launcher_args=launcher_args)
    assert code != -1, f"still running after 90 s (a collective on the default group hung)\n{logs[-4000:]}"
    assert code == 0, logs[-4000:]
    return [r for r in records if "epoch" in r], [r for r in records if "step_sum" in r], logs


def _agree(epochs: list[dict]) -> dict[int, int]:
    """Every epoch's collectives spanned exactly the world then: each rank summed to the world's
    size, saw its elastic rank, gathered the members' uids in rank order and got rank 0's word.
    Returns the world's size at each data epoch's end."""
    assert epochs
    sizes: dict[int, int] = {}
    for r in epochs:
        assert r["sum"] == r["world"] == r["size"], r
        assert r["rank"] == r["ctl_rank"] and r["uids"] == r["members"], r
        assert r["word"] == f"epoch {r['epoch']}", r
        assert sizes.setdefault(r["epoch"], r["world"]) == r["world"], r
    for e, size in sizes.items():
        assert sorted(r["uid"] for r in epochs if r["epoch"] == e) == sorted(
            next(r["members"] for r in epochs if r["epoch"] == e)
        ), f"epoch {e}: every member, and only they, ran it"
        assert len([r for r in epochs if r["epoch"] == e]) == size
    return sizes


def test_a_shrink_then_a_grow_back_keeps_the_default_groups_collectives_on_the_world(tmp_path: Path) -> None:
    # 3 -> 2 at step 3 (uid 2 stands by inside dra.step), 2 -> 3 again at step 14.
    epochs, _ = _run(tmp_path, {"resize_schedule": {"3": 2, "14": 3}}, epochs=6)
    sizes = _agree(epochs)
    assert 2 in sizes.values() and sizes[max(sizes)] == 3, sizes
    assert (tmp_path / "ckpt.pt").exists()


def test_after_a_kill_9_the_survivors_collectives_complete_over_the_new_world(tmp_path: Path) -> None:
    epochs, logs = _run(tmp_path, {}, epochs=4, kill=[1, 5])
    assert '"event":"fault"' in logs.replace(" ", "")
    sizes = _agree(epochs)
    assert sizes[0] == 3 and sizes[max(sizes)] == 2, sizes
    assert {r["uid"] for r in epochs if r["epoch"] == max(sizes)} == {0, 2}


def test_a_replacement_admitted_by_a_grow_gets_the_worlds_group(tmp_path: Path) -> None:
    # uid 1 is killed -9 at step 5; `dra run --max-restarts 1` starts a replacement (DRA_JOIN=1, uid
    # 10000), whose own init_process_group() is a world of one; the heal grows the world back to 3.
    epochs, logs = _run(tmp_path, {}, "--max-restarts", "1", epochs=6, kill=[1, 5], step_sleep=0.05)
    assert "replaced by uid 10000" in logs
    sizes = _agree(epochs)
    joiner = [r for r in epochs if r["uid"] == 10000]
    assert joiner and all(r["sum"] == r["world"] == 3 for r in joiner), joiner
    assert sizes[max(sizes)] == 3, sizes


def test_a_process_standing_by_when_the_job_ends_is_told_its_group_is_gone_and_nothing_hangs(tmp_path: Path) -> None:
    # 3 -> 2 at step 3 and never back: uid 2 stands by inside dra.step until the job ends, then runs
    # the loop's epoch-end code outside the world. Its default group is the launch world's, which the
    # members destroyed: its all_reduce fails at once (no hang), after a warning that names the fix.
    epochs, logs = _run(tmp_path, {"resize_schedule": {"3": 2}}, epochs=3)
    assert set(_agree(epochs).values()) == {2}
    assert {r["uid"] for r in epochs} == {0, 1}
    assert "process 2 is outside the elastic world (finished)" in logs and "ctl.is_member" in logs


def test_a_collective_after_every_step_does_not_hang_when_a_replacement_joins(tmp_path: Path) -> None:
    # The members run the script's all_reduce right after the dra.step that admitted the replacement;
    # the replacement starts its loop from its init and runs its first one a step later. Re-created
    # over the whole world at once, the members waited on it while it waited on them in the next
    # step's gradient reduction, until the script's Gloo timeout. Each side now first gets a group of
    # its own (that one all_reduce sums 2 on the members and 1 on the replacement) and the whole
    # world's from the next dra.step on.
    epochs, steps, logs = _run_all(tmp_path, {}, "--max-restarts", "1", epochs=6, kill=[1, 5], step_sleep=0.05,
                                   per_step=True)
    assert "replaced by uid 10000" in logs
    _agree(epochs)
    joiner = sorted((r["step"], r["step_sum"], r["world"]) for r in steps if r["uid"] == 10000)
    assert joiner and joiner[-1][1] == joiner[-1][2] == 3, joiner
    assert all(s == w for _, s, w in joiner[1:]) and joiner[0][1] in (1.0, 3.0), joiner
    for uid in (0, 2):
        mine = [(r["step"], r["step_sum"], r["world"]) for r in steps if r["uid"] == uid]
        off = [m for m in mine if m[1] != m[2]]
        assert len(off) <= 1 and all(m[1] == 2 and m[2] == 3 for m in off), mine


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async_op"])
def test_a_member_killed_after_its_step_does_not_end_the_scripts_per_step_all_reduce(tmp_path: Path,
                                                                                    async_op: bool) -> None:
    # 4 processes; uid 1 is killed -9 right after its dra.step at step 5, before the all_reduce the
    # script runs after every step. Its ring neighbours' all_reduce raised "Connection closed by
    # peer" and ended the script; the other survivor waited in it until they had exited. Now the
    # survivors' all_reduce completes with their own value (a sum of ones is the world's size it
    # knew), the next dra.step recovers the world and re-creates the group: sums are 3 after it.
    epochs, steps, logs = _run_all(tmp_path, {}, nproc=4, epochs=4, per_step=True, kill_after=[1, 5], n=64,
                                   async_op=async_op)
    assert "lost a member of the world" in logs and '"event":"fault"' in logs.replace(" ", "")
    sizes = _agree(epochs)
    assert sizes[0] == 4 and sizes[max(sizes)] == 3, sizes
    for uid in (0, 2, 3):  # in the order each ran them: 4 up to the fault's step (5), 3 from its recovery on
        mine = [(r["step_sum"], r["world"]) for r in steps if r["uid"] == uid]
        k = mine.index((3.0, 3)) if (3.0, 3) in mine else len(mine)
        assert k == 5 and mine[:k] == [(4.0, 4)] * k and mine[k:] == [(3.0, 3)] * (len(mine) - k) and mine[k:], mine


@pytest.mark.parametrize("objects_first", [False, True], ids=["all_reduce_first", "all_gather_object_first"])
def test_a_member_killed_before_the_epochs_end_collectives_does_not_end_the_job(tmp_path: Path,
                                                                                objects_first: bool) -> None:
    # 4 processes, 64 samples in batches of 4: 4 steps a data epoch. uid 2 is killed -9 right after
    # the dra.step that ends the first epoch, before the script's epoch-end all_reduce, barrier,
    # all_gather_object and broadcast_object_list. The survivors complete them with their own
    # values (their gather holds their own uid four times), and from the next epoch on the
    # collectives span the recovered world of 3 again. With all_gather_object first, the loss is met
    # inside it (in its all_gather of the objects' sizes) and it completes as a whole.
    epochs, _, logs = _run_all(tmp_path, {}, nproc=4, epochs=4, kill_after=[2, 4], n=64, objects_first=objects_first)
    assert "lost a member of the world" in logs
    first = [r for r in epochs if r["epoch"] == 0]
    assert sorted(r["uid"] for r in first) == [0, 1, 3], first
    for r in first:
        assert r["sum"] == r["size"] == 4 and r["rank"] == r["ctl_rank"], r
        assert r["uids"] in (r["members"], [r["uid"]] * 4), r  # completed by all, or taken in
    later = [r for r in epochs if r["epoch"] > 0]
    assert later and set(_agree(later).values()) == {3}


def test_many_changes_of_the_world_leave_the_excepthook_as_it_was_and_an_uncaught_exception_is_survived(
        tmp_path: Path) -> None:
    # torch's init_process_group wraps sys.excepthook in a closure of its own at each call, and the
    # group is made again at every change: the chain grew by one per change (a rank prefix more on
    # every traceback line), and past about 990 changes an uncaught exception hit the recursion
    # limit before dra's hook, so the process no longer left the job and the whole job failed. 12
    # changes here (3 -> 2 -> 3 every 2 steps), then uid 1 raises at step 26, nobody catching it.
    schedule = {str(s): (2 if (s // 2) % 2 else 3) for s in range(2, 26, 2)}
    epochs, logs = _run(tmp_path, {"resize_schedule": schedule}, epochs=8, n=48, raise_at=[1, 26])
    hooks: dict[int, set[int]] = {}
    for r in epochs:
        hooks.setdefault(r["uid"], set()).add(r["hook"])
    assert all(len(h) == 1 for h in hooks.values()), hooks  # the same hook at every data epoch's end
    boom = [line for line in logs.splitlines() if "boom-uncaught" in line]
    assert boom and all(line.count("[rank") <= 1 for line in boom), boom[:3]
    assert "process 1 leaves the job mid-training: uncaught RuntimeError" in logs, logs[-3000:]
    assert max(r["epoch"] for r in epochs) == 7 and 1 not in {r["uid"] for r in epochs if r["epoch"] == 7}
