"""torchft's reconfiguration, measured as the ``torchft_reconfigure`` baseline of ``dra.bench resize``.

torchft (https://github.com/pytorch/torchft) is used the way it is meant to be used: one
``torchft.Manager`` per replica group, all of them talking to one ``torchft`` Lighthouse. Here a
replica group is one process (group world size 1), so "4 replica groups" are 4 real processes;
the data-parallel group over the replica groups is torchft's reconfigurable
``ProcessGroupGloo`` (real Gloo over loopback), and a recovering replica fetches the state from a
healthy one through torchft's default checkpoint transport (``HTTPTransport``).

One measurement (``measure``), every process timed with the wall clock of this machine:

* 4 replica groups form a quorum (Lighthouse ``min_replicas=2``, Manager ``min_replica_size=2``,
  ``use_async_quorum=False`` so that a joiner heals inside ``start_quorum``) and run a few steps;
* **shrink 4->2**: after a committed step, replica groups 2 and 3 leave (``Manager.shutdown(wait=False)``:
  the graceful way, their heartbeats stop at once). The decision time is that step boundary
  (the first of the 4 processes to reach it).
  Groups 0 and 1 start their next step: ``start_quorum`` returns once the Lighthouse has a new
  quorum (torchft has no "leave" message: its split-brain rule forms a 2-member quorum only after
  the leavers' heartbeats expired, ``heartbeat_timeout_ms``, seen at the next ``quorum_tick_ms``),
  torchft reconfigures its ``ProcessGroupGloo`` (``configure``: a new store prefix, a new Gloo
  context), then the first all-reduce of the new world. The figure therefore moves with the
  Lighthouse's heartbeat timeout: 1000 ms here (tuned down from the ``torchft_lighthouse`` CLI
  default of 5000 ms; lower risks evicting live replicas on a loaded machine); the phases split
  it into quorum (mostly that wait), configure and first all-reduce;
* the 2 survivors train a few steps (real forward/backward/SGD step) so their state differs from
  the leavers' copy;
* **grow 2->4**: the two processes that left come back as new replica groups: a fresh ``Manager``
  each (new replica id, heartbeating) is built *before* the decision (like dra's standby ranks,
  whose process and model exist already). Decision: the survivors' leader publishes it; the
  joiners call ``start_quorum``, the survivors continue their loop (steps of quorum, all-reduce
  and commit; the model's compute is left out, as in dra's figure). Measured until the first
  all-reduce in which all 4 take part (if the Lighthouse forms a 3-member quorum first, that step
  is inside the figure: it is how torchft admits joiners). That includes the quorum, the
  ``configure`` of the Gloo group on all 4, the state transfer to the joiners (HTTP: serialize,
  send, deserialize) and loading it into the model and optimizer.
* after the grow, one more step, then every process hashes its parameters: they must be
  identical, while the joiners' hashes differed from the survivors' before the grow (so the
  state transfer really happened).

Configuration: Lighthouse ``min_replicas=2``, ``join_timeout_ms=60000`` (the CLI default; the
Python binding's 100 ms default drops a replica that is 100 ms late to a quorum, which happens
on a loaded 2-core machine), ``quorum_tick_ms=100``; Manager heartbeat every 100 ms (default).

The first all-reduce is a 1-element ``Manager.allreduce`` (dra's is a barrier); the training
steps do not all-reduce gradients (every replica sees the same input, so their gradients agree),
which keeps gradient traffic out of every figure, as in dra's measurement.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from dra._argtypes import count_arg, positive_arg

INSTALL_HINT = ".venv/bin/pip install -r requirements-bench.txt  (torchft 0.2.0 + opentelemetry, torch stays 2.13.0)"

_WARM_STEPS = 2  # committed 4-member steps before the shrink
_SMALL_STEPS = 2  # committed 2-member steps between shrink and grow
_LEAVERS = (2, 3)


def torchft_problem() -> str | None:
    """None when ``import torchft`` works with the installed torch, else why not."""
    try:
        import torchft  # noqa: F401
        from torchft.coordination import LighthouseServer  # noqa: F401
    except Exception as err:  # noqa: BLE001 - any import failure means "not measurable here"
        return f"{type(err).__name__}: {err}"
    return None


# ---------------------------------------------------------------------------------------------
# one replica group (a process)
# ---------------------------------------------------------------------------------------------
def _timed_classes():
    """torchft's Gloo group and HTTP transport, recording how long their calls take."""
    from torchft.checkpointing import HTTPTransport
    from torchft.process_group import ProcessGroupGloo

    class TimedGloo(ProcessGroupGloo):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.spent: dict[str, float] = {}

        def configure(self, *a: Any, **kw: Any) -> None:
            t0 = time.perf_counter()
            super().configure(*a, **kw)
            self.spent["configure"] = self.spent.get("configure", 0.0) + time.perf_counter() - t0

    class TimedHTTP(HTTPTransport):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.spent: dict[str, float] = {}

        def send_checkpoint(self, *a: Any, **kw: Any) -> None:
            t0 = time.perf_counter()
            super().send_checkpoint(*a, **kw)
            self.spent["send"] = self.spent.get("send", 0.0) + time.perf_counter() - t0

        def recv_checkpoint(self, *a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            out = super().recv_checkpoint(*a, **kw)
            self.spent["recv"] = self.spent.get("recv", 0.0) + time.perf_counter() - t0
            return out

    return TimedGloo, TimedHTTP


class _Replica:
    """One replica group of size 1: a Manager, its own TCPStore, the model and optimizer."""

    def __init__(self, args: argparse.Namespace, model, opt, generation: int) -> None:
        import torch.distributed as dist
        from torchft import Manager

        timed_gloo, timed_http = _timed_classes()
        self.model, self.opt = model, opt
        timeout = timedelta(seconds=args.op_timeout)
        self.store = dist.TCPStore("127.0.0.1", 0, None, True, timeout, wait_for_workers=False)
        self.pg = timed_gloo(timeout=timeout)
        self.transport = timed_http(timeout=timeout, num_chunks=0)
        self.loaded_s = 0.0
        self.manager = Manager(
            pg=self.pg, load_state_dict=self._load, state_dict=self._state, min_replica_size=2,
            use_async_quorum=False, timeout=timeout, quorum_timeout=timeout, connect_timeout=timeout,
            rank=0, world_size=1, store_addr="127.0.0.1", store_port=self.store.port,
            lighthouse_addr=args.lighthouse, replica_id=f"dra_bench_{generation}_{args.replica}",
            hostname="127.0.0.1", heartbeat_interval=timedelta(milliseconds=args.heartbeat_ms),
            checkpoint_transport=self.transport)

    def _state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optim": self.opt.state_dict()}

    def _load(self, sd: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        self.model.load_state_dict(sd["model"])
        self.opt.load_state_dict(sd["optim"])
        self.loaded_s += time.perf_counter() - t0

    def step(self, train: bool = True) -> dict[str, Any]:
        """One torchft step: quorum (+ reconfigure + heal), the all-reduce, commit, and (`train`)
        a forward/backward/SGD step of the model."""
        import torch

        self.pg.spent.clear()
        self.transport.spent.clear()
        self.loaded_s = 0.0
        t_start = time.time()
        self.manager.start_quorum()
        t_quorum = time.time()
        marker = torch.ones(1)
        self.manager.allreduce(marker).wait()
        t_allreduce = time.time()
        if self.manager.errored() is not None:
            raise RuntimeError(f"torchft step failed: {self.manager.errored()}")
        n = self.manager.num_participants()
        if not self.manager.should_commit():
            raise RuntimeError(f"torchft did not commit the step (participants {n})")
        figures = {"participants": n, "t_start": t_start, "t_quorum": t_quorum, "t_allreduce": t_allreduce,
                   "configure_s": self.pg.spent.get("configure", 0.0), "recv_s": self.transport.spent.get("recv", 0.0),
                   "send_s": self.transport.spent.get("send", 0.0), "load_s": self.loaded_s}
        if train:
            # d loss / d p = torchft's step counter (the same on every replica, restored on a joiner
            # from the transferred state): SGD moves every parameter, identically on all replicas.
            loss = self.model(torch.tensor(1e6 * self.manager.current_step()))
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        return figures

    def shutdown(self, wait: bool = True) -> None:
        self.manager.shutdown(wait=wait)


def _say(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d} [dra.bench] {msg}", flush=True)


def _digest(model) -> str:
    h = hashlib.sha1()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def _until_four(rep: _Replica, t_decision: float, limit_s: float) -> dict[str, Any]:
    """Steps until one has all 4 replica groups in it (the loop goes on while torchft admits the
    joiners at step boundaries, possibly one quorum at a time); that step's figures, plus the
    step in which this process healed (received the state), if it did. These steps leave out
    the model's forward/backward/SGD (quorum, all-reduce and commit only): the compute of a step
    is no part of a resize's cost, and dra's figure does not contain it either."""
    sizes: list[int] = []
    healed: dict[str, Any] | None = None
    deadline = time.monotonic() + limit_s
    while True:
        s = rep.step(train=False)
        sizes.append(s["participants"])
        if s["recv_s"] > 0:
            healed = s
        if s["participants"] == 4:
            return dict(s, t_decision=t_decision, sizes=sizes, healed=healed)
        if time.monotonic() > deadline:
            raise RuntimeError(f"the joiners were not admitted within {limit_s} s: world sizes {sizes}")


def _worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from dra_bench._blob import blob_model

    os.environ["RANK"] = str(args.replica)  # blob_model seeds by rank: every replica starts different
    torch.set_num_threads(1)
    r = args.replica
    coord = dist.TCPStore("127.0.0.1", args.coord_port, None, False, timedelta(seconds=args.op_timeout))
    _say("coordination store connected")
    model = blob_model(args.mb)
    _say("model built")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    out: dict[str, Any] = {"replica": r, "state_bytes": state_bytes}
    rep = _Replica(args, model, opt, generation=0)
    _say("manager up")
    coord.set(f"up/{r}", "1")
    coord.wait([f"up/{i}" for i in range(4)])
    for _ in range(_WARM_STEPS):
        s = rep.step()
        if s["participants"] != 4:
            raise RuntimeError(f"expected 4 participants before the shrink, got {s['participants']}")
    # ---- shrink 4 -> 2: the decision is this step boundary -------------------------------
    t_decision = time.time()
    out["t_shrink_boundary"] = t_decision
    if r in _LEAVERS:
        # Graceful leave, the quick way: wait=True would first join the checkpoint HTTP server
        # (up to its 0.5 s poll interval) while the Manager still heartbeats.
        rep.shutdown(wait=False)
        del rep
        coord.wait(["shrunk"])  # standby until the survivors are done with the 2-member world
        out["digest_before_grow"] = _digest(model)
        rep = _Replica(args, model, opt, generation=1)  # a new replica group (new id), heartbeating
        coord.set(f"ready/{r}", "1")
        coord.wait(["grow"])
        out["grow"] = _until_four(rep, float(coord.get("grow").decode()), args.op_timeout)
    else:
        s = rep.step()
        out["shrink"] = dict(s, t_decision=t_decision)
        if s["participants"] != 2:
            raise RuntimeError(f"expected 2 participants after the shrink, got {s['participants']}")
        for _ in range(_SMALL_STEPS - 1):
            rep.step()
        out["digest_before_grow"] = _digest(model)
        if r == 0:
            coord.set("shrunk", "1")
            coord.wait([f"ready/{i}" for i in _LEAVERS])
            coord.set("grow", repr(time.time()))  # ---- grow 2 -> 4: the decision ---------
        coord.wait(["grow"])
        out["grow"] = _until_four(rep, float(coord.get("grow").decode()), args.op_timeout)
    s = rep.step()  # one more step in the 4-member world, then compare parameters
    if s["participants"] != 4:
        raise RuntimeError(f"expected 4 participants after the grow, got {s['participants']}")
    out["digest"] = _digest(model)
    Path(args.out, f"replica{r}.json").write_text(json.dumps(out))
    coord.set(f"done/{r}", "1")
    coord.wait([f"done/{i}" for i in range(4)])  # nobody leaves while a peer is still in a step
    rep.shutdown()


# ---------------------------------------------------------------------------------------------
# the parent: Lighthouse, 4 replica processes, the figures
# ---------------------------------------------------------------------------------------------
_CTX = None


def _context():
    """A forkserver that has imported torch and torchft once: the 5 processes of a measurement
    start in a second instead of importing torch + torchft each (~10 s on a loaded 2-core box).
    Startup is not part of any figure; this only keeps the suite's wall time down."""
    global _CTX
    if _CTX is None:
        from multiprocessing import get_context

        ctx = get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "torchft", "dra_bench._blob",
                                     "dra_bench.torchft_baseline"])
        _CTX = ctx
    return _CTX


def _redirect(log_path: str) -> None:
    """Sends this process's stdout/stderr (torchft's Rust logger writes INFO lines to stderr)
    to a log file that the parent shows when something fails."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _lighthouse_main(log_path: str, conn, heartbeat_timeout_ms: int, quorum_tick_ms: int, join_timeout_ms: int) -> None:
    _redirect(log_path)
    from torchft.coordination import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=join_timeout_ms,
                                  quorum_tick_ms=quorum_tick_ms, heartbeat_timeout_ms=heartbeat_timeout_ms)
    conn.send(lighthouse.address())
    conn.recv()  # the parent says stop (or dies: EOFError)
    lighthouse.shutdown()


def _worker_main(log_path: str, args: argparse.Namespace) -> None:
    _redirect(log_path)
    _say(f"replica {args.replica} started")
    _worker(args)


def _tail(path: str, n: int = 3000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-n:]
    except OSError as err:
        return f"(no log: {err})"


def measure(mb: float, *, timeout: float = 300.0, heartbeat_timeout_ms: int = 1000, heartbeat_ms: int = 100,
            quorum_tick_ms: int = 100, join_timeout_ms: int = 60000, op_timeout: float = 120.0) -> dict[str, Any]:
    """One run of the scenario above with `mb` MB of float32 parameters; returns the figures (s)."""
    if not mb > 0:
        raise ValueError(f"mb must be > 0 (MB of model state), got {mb}")
    import torch.distributed as dist

    ctx = _context()
    deadline = time.monotonic() + timeout
    with tempfile.TemporaryDirectory(prefix="dra-bench-torchft-") as tmp:
        here, there = ctx.Pipe()
        lh_log = os.path.join(tmp, "lighthouse.log")
        lighthouse = ctx.Process(target=_lighthouse_main, daemon=True,
                                 args=(lh_log, there, heartbeat_timeout_ms, quorum_tick_ms, join_timeout_ms))
        procs = []
        try:
            lighthouse.start()
            if not here.poll(max(1.0, deadline - time.monotonic())):
                raise RuntimeError(f"the torchft Lighthouse did not start:\n{_tail(lh_log)}")
            address = here.recv()
            coord = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=op_timeout), wait_for_workers=False)
            for r in range(4):
                args = argparse.Namespace(replica=r, mb=mb, coord_port=coord.port, lighthouse=address, out=tmp,
                                          heartbeat_ms=heartbeat_ms, op_timeout=op_timeout)
                p = ctx.Process(target=_worker_main, args=(os.path.join(tmp, f"replica{r}.log"), args), daemon=True)
                p.start()
                procs.append(p)
            for r, p in enumerate(procs):
                p.join(max(0.1, deadline - time.monotonic()))
                if p.exitcode is None:
                    raise RuntimeError(f"torchft replica {r} did not finish within {timeout} s:\n"
                                       + _tail(os.path.join(tmp, f"replica{r}.log")))
                if p.exitcode != 0:
                    raise RuntimeError(f"torchft replica {r} failed ({p.exitcode}):\n"
                                       + _tail(os.path.join(tmp, f"replica{r}.log")))
            reps = [json.loads(Path(tmp, f"replica{r}.json").read_text()) for r in range(4)]
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                p.join(10)
            if lighthouse.is_alive():
                try:
                    here.send("stop")
                except OSError:
                    pass
                lighthouse.join(10)
                if lighthouse.is_alive():
                    lighthouse.kill()
                    lighthouse.join(10)
            here.close()
            there.close()
    survivors = [x for x in reps if x["replica"] not in _LEAVERS]
    joiners = [x for x in reps if x["replica"] in _LEAVERS]
    # The survivors trained on without the leavers, so the joiners' parameters differed before
    # the grow; equal parameters after it show that the state transfer really happened.
    if {x["digest_before_grow"] for x in survivors} & {x["digest_before_grow"] for x in joiners}:
        raise RuntimeError("torchft joiners already held the survivors' parameters: the check would prove nothing")
    digests = {x["digest"] for x in reps}
    if len(digests) != 1:
        raise RuntimeError(f"torchft replicas hold different parameters after the grow: {sorted(digests)}")
    sh = [x["shrink"] for x in survivors]
    t_shrink = min(x["t_shrink_boundary"] for x in reps)  # the first process to act on the decision
    shrink = {
        "total_s": max(s["t_allreduce"] for s in sh) - t_shrink,
        "quorum_s": max(s["t_quorum"] - s["configure_s"] for s in sh) - t_shrink,
        "configure_s": max(s["configure_s"] for s in sh),
        "first_allreduce_s": max(s["t_allreduce"] - s["t_quorum"] for s in sh),
    }
    gr = [x["grow"] for x in reps]
    heals = [x["grow"]["healed"] for x in joiners]
    if any(h is None for h in heals):
        raise RuntimeError("a torchft joiner took part without receiving the state")
    slow = max(heals, key=lambda s: s["t_quorum"])  # the joiner that healed last
    t_decision = gr[0]["t_decision"]
    grow = {
        "total_s": max(s["t_allreduce"] for s in gr) - t_decision,
        "quorum_s": slow["t_quorum"] - t_decision - slow["configure_s"] - slow["recv_s"] - slow["load_s"],
        "configure_s": slow["configure_s"],
        "state_transfer_s": slow["recv_s"] + slow["load_s"],
        "first_allreduce_s": max(s["t_allreduce"] for s in gr) - slow["t_quorum"],
        "sizes": max((x["grow"]["sizes"] for x in reps), key=len),
    }
    return {"shrink": shrink, "grow": grow, "state_bytes": reps[0]["state_bytes"],
            "config": {"heartbeat_timeout_ms": heartbeat_timeout_ms, "heartbeat_ms": heartbeat_ms,
                       "quorum_tick_ms": quorum_tick_ms, "join_timeout_ms": join_timeout_ms}}


def measure_median(mb: float, repeats: int, **kw: Any) -> dict[str, Any]:
    """`repeats` runs of `measure`; every figure is the median over the runs."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    runs = [measure(mb, **kw) for _ in range(repeats)]
    out: dict[str, Any] = {"runs": repeats, "state_bytes": runs[0]["state_bytes"], "config": runs[0]["config"]}
    for kind in ("shrink", "grow"):
        keys = [k for k in runs[0][kind] if k.endswith("_s")]
        out[kind] = {k: statistics.median(r[kind][k] for r in runs) for k in keys}
        out[kind]["all_total_s"] = [r[kind]["total_s"] for r in runs]
    out["grow"]["sizes"] = [r["grow"]["sizes"] for r in runs]
    return out


_PHASES = {"shrink_4to2": ("quorum", "configure", "first_allreduce"),
           "grow_2to4": ("quorum", "configure", "state_transfer", "first_allreduce")}


def torchft_rows(sizes_mb: list[float], results: list[dict[str, Any]] | None = None, *, repeats: int = 3,
                 timeout: float = 300.0, heartbeat_timeout_ms: int = 1000) -> list[dict[str, Any]]:
    """The ``torchft_reconfigure`` rows of ``dra.bench resize`` for each size (median of `repeats`
    runs), plus ``<kind>_<tag>_vs_torchft`` rows that compare dra's ``<kind>_<tag>`` rows found in
    `results` (same run) against them. Without torchft: one NaN row saying why and how to install."""
    from dra_bench._report import result

    problem = torchft_problem()
    if problem is not None:
        return [result("torchft_reconfigure", float("nan"), "s",
                       note=f"not measured: import torchft failed ({problem}); install: {INSTALL_HINT}")]
    dra_rows = {r["name"]: r["value"] for r in (results or [])}
    rows: list[dict[str, Any]] = []
    for mb in sizes_mb:
        tag = f"{mb:g}MB"
        print(f"[resize] {tag}: torchft_reconfigure ({repeats} runs)", flush=True)
        try:
            m = measure_median(mb, repeats, timeout=timeout, heartbeat_timeout_ms=heartbeat_timeout_ms)
        except Exception as err:  # noqa: BLE001 - one failed baseline must not lose the whole suite
            rows.append(result(f"torchft_reconfigure_{tag}", float("nan"), "s",
                               note=f"torchft run failed: {type(err).__name__}: {str(err)[-1500:]}"))
            continue
        cfg = m["config"]
        common = (f"torchft 0.2.0, 4 replica groups of 1 process, Lighthouse min_replicas=2 heartbeat_timeout_ms="
                  f"{cfg['heartbeat_timeout_ms']} quorum_tick_ms={cfg['quorum_tick_ms']} join_timeout_ms="
                  f"{cfg['join_timeout_ms']}, Manager min_replica_size=2 use_async_quorum=False heartbeat "
                  f"{cfg['heartbeat_ms']} ms, torchft ProcessGroupGloo.configure, HTTPTransport; median of "
                  f"{m['runs']} runs")
        notes = {
            "shrink_4to2": (f"{common} {[round(x, 4) for x in m['shrink']['all_total_s']]}; from the step boundary "
                            "(first process to reach it) where 2 replica groups leave (Manager.shutdown, heartbeats stop) to the first "
                            "all-reduce of the 2 survivors; quorum = until the Lighthouse drops the leavers "
                            "(heartbeat expiry: torchft has no leave message)"),
            "grow_2to4": (f"{common} {[round(x, 4) for x in m['grow']['all_total_s']]}; from the decision (the "
                          "joiners' Managers already up, like dra's standby) to the first all-reduce with all 4, "
                          "incl. quorum, configure, HTTP state transfer (params + optimizer) to 2 joiners and "
                          "load_state_dict (steps in between: quorum + all-reduce + commit, no model compute); "
                          f"world sizes stepped through per run: {m['grow']['sizes']}"),
        }
        for kind in ("shrink_4to2", "grow_2to4"):
            key = "shrink" if kind.startswith("shrink") else "grow"
            total = m[key]["total_s"]
            name = f"torchft_reconfigure_{kind}_{tag}"
            rows.append(result(name, total, "s", note=notes[kind]))
            for phase in _PHASES[kind]:
                rows.append(result(f"{name}_{phase}", m[key][f"{phase}_s"], "s"))
            dra_name = f"{kind}_{tag}"
            if dra_name in dra_rows:
                rows.append(result(f"{dra_name}_vs_torchft", dra_rows[dra_name], "s", ("torchft_reconfigure", total),
                                   note="dra (same run) vs torchft's reconfiguration; ratio < 1: dra faster"))
        if m["grow"]["state_transfer_s"] > 0:
            gbps = m["state_bytes"] * 2 / m["grow"]["state_transfer_s"] / 1e9
            rows.append(result(f"torchft_state_transfer_{tag}", gbps, "GB/s",
                               note="torchft HTTPTransport: bytes to 2 joiners (torchft gives each joiner its own "
                                    "up-to-date source replica, the two fetch in parallel) / the slower joiner's "
                                    "fetch + deserialize + load_state_dict time (median)"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dra.bench torchft_baseline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default=None)
    parser.add_argument("--sizes-mb", default="10,100")
    parser.add_argument("--repeats", type=count_arg, default=3)
    parser.add_argument("--timeout", type=positive_arg, default=300.0, help="seconds per run (all processes)")
    parser.add_argument("--heartbeat-timeout-ms", type=count_arg, default=1000,
                        help="the Lighthouse's heartbeat timeout (torchft's CLI default: 5000)")
    args = parser.parse_args(argv)
    from dra_bench._report import write_report

    sizes = [float(x) for x in args.sizes_mb.split(",")]
    for mb in sizes:
        if not mb > 0:
            raise ValueError(f"--sizes-mb: every size must be > 0 MB, got {mb}")
    rows = torchft_rows(sizes, repeats=args.repeats, timeout=args.timeout,
                        heartbeat_timeout_ms=args.heartbeat_timeout_ms)
    write_report("torchft_baseline", rows, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
