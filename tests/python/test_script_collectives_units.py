"""dra.elastic._collectives on its own: which errors count as a lost member, and how a guarded
collective completes when one is lost (as if every member had contributed this process's value).
The fault itself, with real processes and a kill -9, is in test_default_group_outside.py."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dra.elastic import _collectives as c


def test_only_errors_that_say_a_peer_is_gone_count_as_a_lost_member() -> None:
    assert c.peer_gone(RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:4"))
    assert c.peer_gone(RuntimeError("[gloo/transport/tcp/pair.cc:598] Connection reset by peer"))
    assert c.peer_gone(RuntimeError("Timed out waiting 8000ms for recv operation to complete"))
    assert c.peer_gone(dist.DistNetworkError("Failed to recv, got 0 bytes"))
    assert not c.peer_gone(RuntimeError("Tensors must be contiguous"))
    assert not c.peer_gone(RuntimeError("No backend type associated with device type cuda"))
    assert not c.peer_gone(ValueError("timeout must be positive"))  # a mistake in the call, whatever it says


def test_a_lost_collective_completes_as_if_every_member_gave_this_processs_value() -> None:
    t = torch.tensor([1.5, 2.0])
    assert c._completed("all_reduce", {"tensor": t, "op": dist.ReduceOp.SUM, "async_op": False}, 4) is None
    assert t.tolist() == [6.0, 8.0]  # a sum over 4 members of this value: its mean is the value
    m = torch.tensor([3.0])
    c._completed("all_reduce", {"tensor": m, "op": dist.ReduceOp.MAX, "async_op": False}, 4)
    assert m.tolist() == [3.0]
    outs = [torch.zeros(2) for _ in range(3)]
    c._completed("all_gather", {"tensor_list": outs, "tensor": torch.tensor([1.0, 2.0]), "async_op": False}, 3)
    assert [o.tolist() for o in outs] == [[1.0, 2.0]] * 3
    flat = torch.zeros(6)
    c._completed("all_gather_into_tensor", {"output_tensor": flat, "input_tensor": torch.tensor([1.0, 2.0])}, 3)
    assert flat.tolist() == [1.0, 2.0] * 3
    objs = [None] * 3
    mine = {"uid": 7}
    c._completed("all_gather_object", {"object_list": objs, "obj": mine}, 3)
    assert objs == [mine] * 3 and all(o is not mine for o in objs)  # copies, as torch's are
    work = c._completed("barrier", {"async_op": True}, 3)
    assert work.wait() and work.is_completed() and work.get_future().wait() is None


def test_a_tensor_reduced_in_place_is_put_back_and_a_large_one_is_not_guarded() -> None:
    t = torch.tensor([1.0, 2.0])
    restore = c._snapshot("all_reduce", {"tensor": t})
    t.add_(5.0)  # what a ring all-reduce that failed midway leaves
    restore()
    assert t.tolist() == [1.0, 2.0]
    big = torch.empty(c.SNAPSHOT_MAX_BYTES // 4 + 1, dtype=torch.float32)
    assert c._snapshot("all_reduce", {"tensor": big}) is None
    c._snapshot("barrier", {})()  # nothing to put back


def test_without_a_world_to_follow_the_wrappers_call_torch_as_it_is() -> None:
    c.install(None)
    assert getattr(dist.all_reduce, "__dra_guard__", False)
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        t = torch.ones(2)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0]
        with pytest.raises((TypeError, ValueError, RuntimeError)):  # torch's own error, unchanged
            dist.all_reduce(torch.ones(2), op="not an op")
    finally:
        dist.destroy_process_group()
