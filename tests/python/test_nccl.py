"""NCCL backend from Python: build information, clean failures without a GPU, and (only on a
machine with a CUDA GPU) one-rank init, all-reduce, broadcast, abort and timeout handling, the
elastic controller on one rank without device synchronisations, plus a two-process shrink/grow
when two GPUs are visible. GPU tests skip cleanly elsewhere; the call
sequences of every rebuild case are tested on the CPU in tests/cpp/test_nccl_rebuild.cpp."""

from __future__ import annotations

import ctypes
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import dra
from dra import _core

nccl_compiled = bool(getattr(_core.comm, "nccl_compiled", False))
has_cuda = torch.cuda.is_available()
needs_nccl = pytest.mark.skipif(not nccl_compiled, reason="dra built without the NCCL backend (DRA_WITH_NCCL=OFF or no nccl.h)")
needs_gpu = pytest.mark.skipif(not (nccl_compiled and has_cuda), reason="needs a CUDA GPU, torch with CUDA and the NCCL backend")
ROOT = Path(__file__).resolve().parents[2]
needs_two_gpus = pytest.mark.skipif(
    not (nccl_compiled and has_cuda and torch.cuda.device_count() >= 2), reason="needs two CUDA GPUs"
)


def _wheel_nccl() -> Path | None:
    try:
        import nvidia  # noqa: PLC0415  (the namespace package of the NVIDIA wheels)
    except ImportError:
        return None
    for root in nvidia.__path__:
        candidate = Path(root) / "nccl"
        if (candidate / "include" / "nccl.h").exists():
            return candidate
    return None


def _version_of_code(code: int) -> str:
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


# ---- everywhere ------------------------------------------------------------------------------


def test_build_info_reports_nccl_backend():
    backends = dra.build_info()["backends"]
    assert "nccl" in backends and "nccl_runtime" in backends
    if not nccl_compiled:
        assert backends["nccl"] is None
        assert backends["nccl_runtime"] is None
        return
    assert re.fullmatch(r"2\.\d+\.\d+", backends["nccl"])
    wheel = _wheel_nccl()
    if wheel is not None and not os.environ.get("NCCL_ROOT"):
        # Built here against the wheel's header: the reported version is that header's.
        text = (wheel / "include" / "nccl.h").read_text()
        code = int(re.search(r"#define NCCL_VERSION_CODE (\d+)", text).group(1))
        assert backends["nccl"] == _version_of_code(code)


@needs_nccl
def test_a_pip_wheels_nccl_is_a_load_candidate_found_from_the_running_interpreter(tmp_path):
    """A wheel of dra built on another machine knew only that machine's libnccl path (compiled in)
    besides the loader's search path: a user's `pip install nvidia-nccl-cu13` was never found.
    `import dra` names the interpreter's copy to the loader (DRA_NCCL_PIP_LIBRARY, tried after
    DRA_NCCL_LIBRARY and libnccl.so.2, before the build machine's path)."""
    wheel = _wheel_nccl()
    if wheel is None:
        pytest.skip("no nvidia-nccl wheel in this interpreter")
    code = ("import os, dra, dra._core as c; print(os.environ.get('DRA_NCCL_PIP_LIBRARY')); "
            "print(c.comm.nccl_load_error())")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_NCCL")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == str(wheel / "lib" / "libnccl.so.2")


@needs_nccl
def test_runtime_version_is_the_loaded_library():
    runtime = _core.comm.nccl_runtime_version()
    if runtime is None:
        assert "cannot load NCCL" in _core.comm.nccl_load_error()
        return
    assert _core.comm.nccl_load_error() == ""
    assert dra.build_info()["backends"]["nccl_runtime"] == runtime
    # Cross-check against the library itself, read without dra: the copy the loader resolves
    # (DRA_NCCL_LIBRARY, libnccl.so.2 on the search path, or the wheel's) reports the same.
    candidates = [os.environ.get("DRA_NCCL_LIBRARY"), "libnccl.so.2"]
    wheel = _wheel_nccl()
    if wheel is not None:
        candidates.append(str(wheel / "lib" / "libnccl.so.2"))
    for name in filter(None, candidates):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        code = ctypes.c_int(0)
        assert lib.ncclGetVersion(ctypes.byref(code)) == 0
        assert runtime == _version_of_code(code.value)
        return
    pytest.skip("no libnccl reachable through ctypes to cross-check")


@needs_nccl
def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="device"):
        _core._testing.NcclWorld(device=-1)
    with pytest.raises(ValueError, match="timeout_s"):
        _core._testing.NcclWorld(device=0, timeout_s=0.0)


@needs_nccl
@pytest.mark.skipif(has_cuda, reason="checks the failure on machines without CUDA")
def test_without_cuda_fails_before_any_nccl_call():
    # Either the CUDA check or, where no libnccl is reachable at all, the library loader says why.
    with pytest.raises(dra.DraError, match="CUDA|cannot load NCCL"):
        _core._testing.NcclWorld(device=0)


# ---- one GPU ---------------------------------------------------------------------------------


def _one_rank_world(**kwargs) -> _core._testing.NcclWorld:
    world = _core._testing.NcclWorld(device=0, capture_log=True, **kwargs)
    assert world.rebuild(1, [], [0], 0) == "fresh_init"
    return world


@needs_gpu
@pytest.mark.timeout(120)
def test_one_rank_init_and_keep():
    world = _one_rank_world()
    assert (world.rank, world.size, world.epoch, world.active) == (0, 1, 1, True)
    assert world.last_plan["taken"] == "fresh_init"
    assert any('"event":"nccl_rebuild_done"' in line for line in world.log)
    # Same members, no fault: the communicator is kept, only the epoch moves.
    assert world.rebuild(2, [0], [0], 0) == "keep"
    assert world.epoch == 2
    world.close()
    assert not world.active


@needs_gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64])
def test_all_reduce_and_broadcast_one_rank(dtype):
    world = _one_rank_world()
    expected = torch.arange(4099, device="cuda").to(dtype)
    t = expected.clone()
    world.all_reduce_sum(t)
    torch.cuda.synchronize()
    assert torch.equal(t, expected)  # a sum over one rank is the tensor itself
    world.broadcast(t, 0)
    torch.cuda.synchronize()
    assert torch.equal(t, expected)
    with pytest.raises(ValueError, match="root"):
        world.broadcast(t, 1)
    world.close()


@needs_gpu
@pytest.mark.timeout(120)
def test_collectives_follow_the_current_stream():
    world = _one_rank_world()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        t = torch.full((1 << 20,), 3.0, device="cuda")
        world.all_reduce_sum(t)
        t.mul_(2)  # ordered after the all-reduce on the same stream
    side.synchronize()
    assert torch.all(t == 6.0)
    world.barrier()
    world.close()


@needs_gpu
@pytest.mark.timeout(120)
def test_bad_tensors_are_rejected_and_cpu_tensors_are_staged():
    world = _one_rank_world()
    # A CPU tensor travels through a device copy (the state handoff's small CPU pieces).
    cpu = torch.ones(4)
    world.all_reduce_sum(cpu)
    assert torch.equal(cpu, torch.ones(4))
    with pytest.raises(ValueError, match="dtype"):
        world.all_reduce_sum(torch.ones(4, device="cuda", dtype=torch.complex64))
    with pytest.raises(ValueError, match="contiguous"):
        world.all_reduce_sum(torch.ones(4, 4, device="cuda").t())
    world.close()


@needs_gpu
@pytest.mark.timeout(120)
def test_abort_makes_the_communicator_unusable():
    world = _one_rank_world()
    t = torch.ones(1024, device="cuda")
    world.all_reduce_sum(t)
    started = time.monotonic()
    world.abort()
    assert time.monotonic() - started < 30
    assert not world.active
    with pytest.raises(dra.DraError):
        world.all_reduce_sum(t)
    # A fault reported on the same membership: rebuilt from scratch.
    assert world.rebuild(2, [0], [0], 0, abortive=True) == "fresh_init"
    world.all_reduce_sum(t)
    torch.cuda.synchronize()
    world.close()


@needs_gpu
@pytest.mark.timeout(120)
def test_init_timeout_aborts_instead_of_hanging():
    # A two-rank world whose second rank never comes: the non-blocking init cannot finish, the
    # routine aborts it after the timeout and raises TimeoutError.
    world = _core._testing.NcclWorld(device=0, timeout_s=3.0, capture_log=True)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="ncclCommInitRankConfig"):
        world.rebuild(1, [], [0, 1], 0)
    elapsed = time.monotonic() - started
    assert 2.5 < elapsed < 60
    assert not world.active


# ---- two GPUs: shrink and grow across processes ----------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_rank_worker(uid: int, port: int, queue) -> None:  # runs in a spawned process
    import torch  # noqa: PLC0415

    from dra import _core  # noqa: PLC0415

    try:
        torch.cuda.set_device(uid)
        world = _core._testing.NcclWorld(device=uid, store_host="127.0.0.1", store_port=port, store_server=uid == 0, timeout_s=60)
        out = {"init": world.rebuild(1, [], [0, 1], uid)}
        t = torch.full((1000,), float(uid + 1), device=f"cuda:{uid}")
        world.all_reduce_sum(t)
        torch.cuda.synchronize()
        out["sum"] = float(t[0])
        out["shrink"] = world.rebuild(2, [0, 1], [0], uid)  # uid 1 leaves
        if uid == 0:
            t = torch.ones(10, device="cuda:0")
            world.all_reduce_sum(t)
            torch.cuda.synchronize()
            out["size_after_shrink"] = world.size
        out["grow"] = world.rebuild(3, [0], [0, 1], uid)  # uid 1 joins again
        t = torch.full((1000,), float(uid + 1), device=f"cuda:{uid}")
        world.all_reduce_sum(t)
        torch.cuda.synchronize()
        out["sum_after_grow"] = float(t[0])
        out["rank_after_grow"] = world.rank
        world.close()
        queue.put((uid, out))
    except BaseException as exc:  # report, do not hang the parent
        queue.put((uid, {"error": repr(exc)}))


@needs_two_gpus
@pytest.mark.timeout(240)
def test_two_processes_shrink_and_grow():
    import torch.multiprocessing as mp  # noqa: PLC0415

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_two_rank_worker, args=(uid, port, queue)) for uid in (0, 1)]
    for p in procs:
        p.start()
    try:
        results = dict(queue.get(timeout=200) for _ in procs)
    finally:  # a hung worker must not outlive the test holding a GPU
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    for uid in (0, 1):
        assert "error" not in results[uid], results[uid]
        assert results[uid]["init"] == "fresh_init"
        assert results[uid]["sum"] == 3.0
        assert results[uid]["sum_after_grow"] == 3.0
        assert results[uid]["rank_after_grow"] == uid
    runtime = tuple(int(x) for x in _core.comm.nccl_runtime_version().split("."))
    assert results[0]["shrink"] == ("shrink" if runtime >= (2, 27, 0) else "fresh_init")
    assert results[1]["shrink"] == "leave"
    assert results[0]["size_after_shrink"] == 1
    assert results[0]["grow"] == results[1]["grow"] == ("grow" if runtime >= (2, 29, 0) else "fresh_init")


def test_the_gpu_checks_direct_build_compiles_what_cmake_builds():
    # benchmarks/gpu/check.sh compiles dra with the compiler directly where CMake cannot find its
    # packages (a bare GPU machine). Its file lists once drifted from CMake's targets: it made no
    # dra._sim module, and `import dra` failed there. Held to the development build's targets.
    commands = ROOT / "build" / "py" / "compile_commands.json"
    if not commands.is_file():
        pytest.skip(f"no {commands} (scripts/setup.sh's build writes it)")
    cmake: dict[str, set[str]] = {}
    for entry in json.loads(commands.read_text()):
        m = re.search(r"CMakeFiles/([^/]+)\.dir/", entry.get("output") or entry["command"])
        if m:
            cmake.setdefault(m.group(1), set()).add(str(Path(entry["file"]).resolve().relative_to(ROOT)))
    listed = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu" / "check.sh"), "--list-sources"],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert listed.returncode == 0, listed.stderr
    lists = {line.split(":")[0]: set(line.split()[1:]) for line in listed.stdout.splitlines()}
    core = cmake.get("_core", set()) | cmake.get("dra_dra", set()) | cmake.get("dra_energy", set())
    nccl = {f for f in lists["core"] if f.startswith("src/comm/nccl/")}
    assert core - nccl == lists["core"] - nccl, (core ^ lists["core"]) - nccl
    assert {f for f in core if f.startswith("src/comm/nccl/")} <= nccl
    assert cmake.get("_sim", set()) == lists["sim"]


def _elastic_gpu_script(tmp_path: Path, *args: str) -> dict[str, dict]:
    out = tmp_path / "elastic.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu" / "elastic_gpu.py"), "--quick", "--steps", "5", "--rounds", "2",
         "--decide-every", "3", "--json", str(out), *args],
        capture_output=True, text=True, timeout=280, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {r["name"]: r for r in json.loads(out.read_text())["results"]}


@pytest.mark.timeout(300)
def test_the_gpu_elastic_script_runs_on_the_cpu(tmp_path):
    # The same script over Gloo on the CPU, so that the GPU check's script itself is checked in CI.
    rows = _elastic_gpu_script(tmp_path, "--device", "cpu")
    assert rows["synchronising_steps"]["value"] == 0
    assert rows["elastic_step_ms_one_rank"]["value"] > 0 and rows["elastic_step_ms_one_rank"]["baseline"]


@needs_gpu
@pytest.mark.timeout(300)
def test_elastic_controller_on_real_nccl_never_synchronises_the_device(tmp_path):
    # benchmarks/gpu/elastic_gpu.py, small: a one-rank elastic world on real NCCL trains with
    # dra.step(cuda loss) under torch.cuda.set_sync_debug_mode("error"), then abort and re-init.
    rows = _elastic_gpu_script(tmp_path)
    assert rows["synchronising_steps"]["value"] == 0, rows["synchronising_steps"]
    assert rows["device_reads"]["value"] > 0  # decision steps read what rode with the reductions
