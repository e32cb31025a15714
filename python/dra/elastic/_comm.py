"""Per-epoch Gloo communicator of the elastic world.

One c10d ProcessGroupGloo per world epoch, rendezvoused through a PrefixStore ``pg/<epoch>/``
over the job's TCPStore, with a bounded timeout on every collective (a dead or hung peer raises
instead of blocking). Teardown order: abort (closes the connections, so peers blocked on this
rank fail at once instead of waiting for their timeout), then drop.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from dra.elastic._store import StoreClient


class CommFailure(RuntimeError):
    """A collective or rebuild failed: a peer died, hung, or the rendezvous timed out."""


class GlooWorld:
    """The communicator of one epoch: rank/size, collectives with timeouts, abort."""

    def __init__(self, store: StoreClient, epoch: int, members: list[int], uid: int, timeout_s: float) -> None:
        self.epoch, self.members, self.uid = int(epoch), list(members), int(uid)
        self.rank = self.members.index(self.uid)
        self.size = len(self.members)
        self.timeout_s = float(timeout_s)
        t0 = time.perf_counter()
        try:
            prefix = dist.PrefixStore(f"pg/{self.epoch}/", store.store)
            self.pg = dist.ProcessGroupGloo(prefix, self.rank, self.size, timedelta(seconds=self.timeout_s))
        except Exception as err:  # noqa: BLE001
            raise CommFailure(f"building the Gloo world of epoch {epoch} failed: {_first_line(err)}") from None
        self.build_s = time.perf_counter() - t0
        self._aborted = False

    # -- collectives ------------------------------------------------------------------------
    def _wait(self, work, what: str) -> None:
        try:
            work.wait()
        except Exception as err:  # noqa: BLE001
            raise CommFailure(f"{what} in world epoch {self.epoch} failed: {_first_line(err)}") from None

    def all_reduce_sum(self, tensor: torch.Tensor) -> None:
        self._wait(self.pg.allreduce([tensor]), "all_reduce")

    def all_reduce_max(self, tensor: torch.Tensor) -> None:
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX
        self._wait(self.pg.allreduce([tensor], opts), "all_reduce(max)")

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        opts.rootTensor = 0
        self._wait(self.pg.broadcast([tensor], opts), "broadcast")

    def send_many(self, tensor: torch.Tensor, dsts: list[int], tag: int) -> None:
        works = [self.pg.send([tensor], d, tag) for d in dsts]
        for w in works:
            self._wait(w, "send")

    def recv(self, tensor: torch.Tensor, src: int, tag: int) -> None:
        self._wait(self.pg.recv([tensor], src, tag), "recv")

    def barrier(self) -> None:
        one = torch.ones(1)
        self.all_reduce_sum(one)

    def abort(self) -> None:
        """Closes this rank's connections; never raises. The world is unusable afterwards."""
        if self._aborted:
            return
        self._aborted = True
        try:
            self.pg.abort()
        except Exception:  # noqa: BLE001  (logging-only: teardown must not raise)
            pass

    def close(self) -> None:
        """Normal teardown after a voluntary resize (peers are alive and idle)."""
        self.pg = None  # type: ignore[assignment]


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"
