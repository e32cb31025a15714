"""Groups a script makes with ``dist.new_group`` under `dra run`, as a script training on NCCL
makes a Gloo group for its CPU-side collectives: one over every rank follows the world, one over
part of it says what to do. Real processes, real Gloo.

Before, dra re-created only torch's default group after a change of the world; destroying it
destroyed the script's group too, so the script's next collective on it raised torch's "is not
initialized in the world group map", and one member's kill -9 ended the whole job although dra
had recovered (seen on examples/ddp/train_dra.py with a ``dist.new_group()`` added). Now each
group over every rank is made again over the new world in the order the script made it, and the
object the script holds runs on it (docs/guide/elastic.md, "Groups made with dist.new_group"), and
answers ``g.size()`` and ``g.rank()`` for it. So does a reference the script kept to torch's default
group of the launch world (``WORLD = dist.group.WORLD``): its collectives raised "not initialized in
the world group map" after the first change, and ``WORLD.size()`` named the launch world's size.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _elastic_harness import run_logged_script

pytestmark = pytest.mark.timeout(150)

SCRIPT = r"""
import json, os, signal, time
from datetime import timedelta
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import dra, dra.elastic as de

cfg = json.loads(os.environ["CFG"])
dist.init_process_group("gloo", timeout=timedelta(seconds=8))
WORLD = dist.group.WORLD  # kept, as a trainer's constructor keeps it (self.pg = dist.group.WORLD)
# Made before dra's controller exists, as scripts do right after init_process_group.
cpu = dist.new_group(backend="gloo", timeout=timedelta(seconds=7))
pair = dist.new_group(ranks=[0, 1]) if cfg.get("pair") else None
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
model = de.DistributedDataParallel(net, opt, sampler, process_group=cpu)  # a group over every rank: the world
ctl = model.controller
lazy = None
for epoch in ctl.epochs(cfg.get("epochs", 6)):
    # A group made anew every data epoch (also right after a member was lost in the last one's
    # collectives, before any dra.step).
    fresh = dist.new_group(backend="gloo") if cfg.get("per_epoch") else None
    for xb, yb in loader:
        if [ctl.uid, ctl.step_index] == cfg.get("kill"):
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad()
        F.mse_loss(model(xb), yb).backward()
        opt.step()
        dra.step(F.mse_loss(model(xb), yb).detach())
        if [ctl.uid, ctl.step_index] == cfg.get("kill_after"):  # after its dra.step, before the script's collective
            os.kill(os.getpid(), signal.SIGKILL)
        if cfg.get("per_step"):
            each = torch.ones(1)
            dist.all_reduce(each, group=cpu)
            rec(step=ctl.step_index, uid=ctl.uid, step_sum=each.item(), world=ctl.world_size)
        if cfg.get("lazy_at") is not None and ctl.step_index >= cfg["lazy_at"]:
            # A metrics group made lazily and cached: the members make it at lazy_at, a replacement
            # that joins later at its own first step there.
            lazy = lazy or dist.new_group(backend="gloo")
            each = torch.ones(1)
            dist.all_reduce(each, group=lazy)
            rec(step=ctl.step_index, uid=ctl.uid, lazy_sum=each.item(), world=ctl.world_size)
        time.sleep(cfg.get("step_sleep", 0.0))
    if not ctl.is_member:  # a process standing by when the job ended: its collectives are guarded
        continue
    if cfg.get("group_at_end"):  # the first call after a member killed after the epoch's last step
        at_end = dist.new_group(backend="gloo")
        dist.all_reduce(torch.ones(1), group=at_end)
    one = torch.ones(1)
    dist.all_reduce(one, group=cpu)
    if fresh is not None:
        again = torch.ones(1)
        dist.all_reduce(again, group=fresh)
        assert again.item() == one.item(), (again.item(), one.item())
    dist.barrier(group=cpu)
    kept, low = torch.ones(1), torch.ones(1)
    dist.all_reduce(kept, group=WORLD)
    cpu.allreduce([low]).wait()  # torch's low-level call on the object
    uids = [None] * dist.get_world_size(cpu)
    dist.all_gather_object(uids, ctl.uid, group=cpu)
    r = dict(epoch=sampler.epoch, uid=ctl.uid, sum=one.item(), world=ctl.world_size, rank=dist.get_rank(cpu),
             ctl_rank=ctl.rank, size=dist.get_world_size(cpu), backend=str(dist.get_backend(cpu)),
             ranks=dist.get_process_group_ranks(cpu), uids=uids, members=list(ctl.members),
             methods=[cpu.size(), cpu.rank(), WORLD.size(), WORLD.rank(), dist.get_world_size(WORLD)], kept=kept.item(),
             low=low.item())
    if pair is not None and ctl.epoch > 0:
        try:
            dist.all_reduce(torch.ones(1), group=pair)
            r["pair"] = "ran"
        except RuntimeError as e:
            r["pair"] = str(e)
        try:
            if ctl.uid not in (0, 1):  # torch gave the others a marker, not a group
                raise RuntimeError("not a member")
            pair.barrier().wait()
            r["pair_method"] = "ran"
        except RuntimeError as e:
            r["pair_method"] = str(e)
    rec(**r)
try:  # a process standing by at the end: its group's members have left
    dist.all_reduce(torch.ones(1), group=dist.new_group())
    rec(end_group="made", uid=ctl.uid, member=ctl.is_member)
except RuntimeError as e:
    rec(end_group=str(e), uid=ctl.uid, member=ctl.is_member)
dist.destroy_process_group(cpu)
try:  # a mistake, after the world changed: a clear error, not a wait on the world it was made for
    dist.all_reduce(torch.ones(1), group=cpu)
    rec(destroyed_use="ran", uid=ctl.uid)
except RuntimeError as e:
    rec(destroyed_use=str(e), uid=ctl.uid)
dist.destroy_process_group()
rec(final=True, uid=ctl.uid)
"""


def _run(tmp_path: Path, options: dict, *launcher_args: str, nproc: int = 3, **cfg) -> tuple[list, list, str]:
    options = {"policy": "none", "fault_timeout_s": 3.0, **options}
    code, logs, records = run_logged_script(tmp_path, SCRIPT, nproc, options, cfg, timeout=90,
                                            launcher_args=launcher_args)
    assert code != -1, f"still running after 90 s (a collective on the script's group hung)\n{logs[-4000:]}"
    assert code == 0, logs[-4000:]
    return [r for r in records if "epoch" in r], [r for r in records if "step_sum" in r or "lazy_sum" in r or
                                                    "destroyed_use" in r or "end_group" in r], logs


def _agree(epochs: list[dict]) -> dict[int, int]:
    """Every epoch's collectives on the script's group spanned exactly the world then."""
    assert epochs
    sizes: dict[int, int] = {}
    for r in epochs:
        assert r["sum"] == r["world"] == r["size"] == r["kept"] == r["low"], r
        assert r["methods"] == [r["world"], r["rank"]] * 2 + [r["world"]], r  # g.size(), g.rank(): today's world
        assert r["rank"] == r["ctl_rank"] and r["uids"] == r["members"], r
        assert r["ranks"] == list(range(r["world"])) and r["backend"] == "gloo", r
        assert sizes.setdefault(r["epoch"], r["world"]) == r["world"], r
    return sizes


def test_a_whole_world_group_follows_a_shrink_and_a_grow_and_a_part_world_group_says_what_to_do(
        tmp_path: Path) -> None:
    epochs, ends, _ = _run(tmp_path, {"resize_schedule": {"3": 2, "14": 3}}, epochs=6, pair=True)
    sizes = _agree(epochs)
    assert 2 in sizes.values() and sizes[max(sizes)] == 3, sizes
    # uid 2 is not in the pair: torch makes its collectives on it no-ops, before and after.
    told = [r["pair"] for r in epochs if "pair" in r and r["uid"] in (0, 1)]
    assert told and all("dist.new_group(ranks=[0, 1]) in a world of 3" in t and "ctl.epoch" in t for t in told), told
    told = [r["pair_method"] for r in epochs if r.get("pair_method", "not") != "not a member"]  # it waited on
    # the world it was made for (torch's low-level call on the object)
    assert len(told) > 3 and all("ProcessGroup.barrier on a group made by dist.new_group(ranks=[0, 1])" in t
                                 for t in told), told
    # A group the script destroyed and then used: it waited on the world it was first made for.
    used = [r["destroyed_use"] for r in ends if "destroyed_use" in r]
    assert len(used) == 3 and all("the script destroyed" in u for u in used), used


def test_a_process_standing_by_at_the_end_is_told_it_cannot_make_a_group(tmp_path: Path) -> None:
    # 3 -> 2 at step 3 and never back: uid 2 stands by to the end, then runs the script's code after
    # the loop. Its dist.new_group waited forever on members that had left; now it raises naming
    # ctl.is_member, and the members make theirs.
    epochs, ends, _ = _run(tmp_path, {"resize_schedule": {"3": 2}}, epochs=2)
    assert set(_agree(epochs).values()) == {2}
    made = {r["uid"]: r["end_group"] for r in ends if "end_group" in r}
    assert made[0] == made[1] == "made" and "outside the elastic world" in made[2] and "ctl.is_member" in made[2], made


def test_after_a_kill_9_the_survivors_group_runs_over_the_new_world(tmp_path: Path) -> None:
    epochs, _, logs = _run(tmp_path, {}, epochs=4, kill=[1, 5])
    assert '"event":"fault"' in logs.replace(" ", "")
    sizes = _agree(epochs)
    assert sizes[0] == 3 and sizes[max(sizes)] == 2, sizes


@pytest.mark.parametrize("killed", [[1, 5], [2, 3]], ids=["uid1_step5", "uid2_step3"])
def test_a_member_killed_in_the_scripts_collective_on_its_group_does_not_end_the_job(tmp_path: Path,
                                                                                    killed: list[int]) -> None:
    # A member dies right after its dra.step, before the all_reduce on the script's group (made
    # before the controller, never re-created): the survivors complete it with their own value, the
    # next dra.step recovers, sums are 3 after. The script's object kept its connections open, so a
    # survivor waiting in that all_reduce waited for its timeout and was left out (world 2); the
    # collectives now run on a group of dra's own, closed at the loss.
    uid, step = killed
    epochs, steps, logs = _run(tmp_path, {}, nproc=4, epochs=4, per_step=True, kill_after=killed, n=64)
    assert "lost a member of the world" in logs
    sizes = _agree(epochs)  # 4 steps a data epoch
    assert sizes[0] == (4 if step >= 4 else 3) and sizes[max(sizes)] == 3, sizes
    for other in sorted({0, 1, 2, 3} - {uid}):
        mine = [(r["step_sum"], r["world"]) for r in steps if r["uid"] == other and "step_sum" in r]
        k = mine.index((3.0, 3))
        assert k == step and mine[:k] == [(4.0, 4)] * k and mine[k:] == [(3.0, 3)] * (len(mine) - k), mine


def test_a_member_lost_while_a_group_is_made_is_taken_in_and_the_group_made_at_the_next_step(tmp_path: Path) -> None:
    # uid 2 dies after the dra.step that ends epoch 0; the survivors' next call is a dist.new_group,
    # whose rendezvous waited for the dead process for torch's 30 minutes. Now it gives up after the
    # store's timeout (5 s here), the loss is taken in as in a collective, and the next dra.step
    # makes the group over the recovered world.
    epochs, _, logs = _run(tmp_path, {"store_timeout_s": 5.0}, nproc=4, epochs=3, group_at_end=True,
                           kill_after=[2, 4], n=64)
    assert "dist.new_group lost a member of the world" in logs, logs[-3000:]
    assert set(_agree([r for r in epochs if r["epoch"] > 0]).values()) == {3}


def test_a_group_made_while_a_lost_members_recovery_is_pending_is_made_for_real_at_the_next_step(
        tmp_path: Path) -> None:
    # 4 steps a data epoch; uid 2 dies after the dra.step that ends epoch 0, so the survivors lose it
    # in the epoch-end collectives, and epoch 1 starts with a dist.new_group before any dra.step. It
    # waited on peers that could not come (a rendezvous on the stand-in); now it does no
    # communication until that step, which makes it over the recovered world (the script checks
    # that its sum equals the script's group's at every epoch's end).
    epochs, _, logs = _run(tmp_path, {}, nproc=4, epochs=3, per_epoch=True, kill_after=[2, 4], n=64)
    assert "lost a member of the world" in logs
    assert set(_agree([r for r in epochs if r["epoch"] > 0]).values()) == {3}


def test_a_replacement_gets_the_group_made_at_its_start_and_the_one_the_members_made_lazily(tmp_path: Path) -> None:
    # The members make a metrics group lazily at step 2 and keep it; uid 1 is killed at step 5 and
    # its replacement (`--max-restarts 1`, uid 10000) makes the first group at its start and the
    # lazy one at its first step. The members never call dist.new_group again: the replacement's
    # call waited on them. Now that group was made on the replacement too when it was admitted, and
    # its call gets it: every lazy sum is the world's size from the step after the admission on.
    epochs, steps, logs = _run(tmp_path, {}, "--max-restarts", "1", epochs=6, kill=[1, 5], step_sleep=0.05,
                               lazy_at=2)
    assert "replaced by uid 10000" in logs
    sizes = _agree(epochs)
    joiner = [r for r in epochs if r["uid"] == 10000]
    assert joiner and all(r["sum"] == 3 for r in joiner) and sizes[max(sizes)] == 3, (joiner, sizes)
    lazy = sorted((r["step"], r["uid"], r["lazy_sum"], r["world"]) for r in steps if "lazy_sum" in r)
    last = max(r[0] for r in lazy)
    assert {(u, s) for st, u, s, w in lazy if st == last} == {(0, 3.0), (2, 3.0), (10000, 3.0)}, lazy
    # Off by the world's size at most once per process: the step a joiner is admitted at (the
    # members' collective then runs apart from the joiner's, docs/guide/elastic.md).
    assert all(len([r for r in lazy if r[1] == u and r[2] != r[3]]) <= 1 for u in (0, 2, 10000)), lazy
    assert "differ between the members" not in logs, logs[-3000:]


def test_the_ddp_drop_in_refuses_a_process_group_without_a_default_group() -> None:
    # Over every rank (the tests above pass their group) it is the world; without a default group
    # there is nothing to compare with, and the error says to leave it None.
    import torch

    import dra.elastic as de

    ds = torch.utils.data.TensorDataset(torch.randn(8, 2))
    net = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match="process_group: leave it None"):
        de.DistributedDataParallel(net, torch.optim.SGD(net.parameters(), lr=0.1), de.DistributedSampler(ds),
                                   process_group=object())
