#!/usr/bin/env bash
# One-shot GPU check of dra's NCCL backend (docs/design/nccl.md). On a machine with an NVIDIA GPU,
# PyTorch with CUDA and NCCL (no network needed) it
#   1. builds dra against the torch there, into a private folder (nothing is installed),
#   2. runs the NCCL tests (tests/python/test_nccl.py: one-rank init, all-reduce, broadcast,
#      stream order, abort, init timeout; shrink/grow across two processes when 2+ GPUs),
#   3. runs the elastic controller on real NCCL, one rank (benchmarks/gpu/elastic_gpu.py): a
#      transformer trained with dra.step(cuda loss) under set_sync_debug_mode("error") (zero
#      synchronising steps is checked), its step time against plain DDP, the NVML energy counter,
#      and dra's communicator through init, keep, abort and re-init,
#   4. runs the NCCL benchmark suite, `python -m dra.bench nccl --mode real` (the same code that
#      runs emulated on CPUs): all-reduce bandwidth 1 KiB .. 1 GiB through dra against
#      torch.distributed's NCCL, dra's NCCL init against torch's, dra.step on a 0-d CUDA tensor
#      and on a real training step; with 2+ GPUs also the state handoff against plain send/recv,
#      an elastic shrink and grow through backend="nccl", and a hung peer revoked by the watchdog,
# and writes summary.json, summary.txt, nccl.json (+ nccl.png) and elastic_gpu.json (the common benchmark
# report) and the logs under the output folder. Bounded: the whole run stays within
# DRA_GPU_CHECK_BUDGET_S (default 470 s, under 8 minutes).
#
# Without a GPU it still builds, runs the tests (GPU tests skip), elastic_gpu.py on the CPU and the
# suite on the emulated library (--quick), then exits 3: the CPU-side steps are checked anywhere.
# --installed skips the build and checks the dra the interpreter already imports (a quick CPU
# check of the script itself: benchmarks/gpu/check.sh --installed on a development machine).
#
# Usage: benchmarks/gpu/check.sh [--out DIR] [--python PY] [--nproc N] [--max-bytes B]
#                                [--skip-build] [--skip-tests] [--skip-bench] [--installed]
#        benchmarks/gpu/check.sh --prepare-deps   # copy Eigen/pybind11/nccl.h headers into
#                                                 # build/gpu-deps, for a machine that lacks them
#        benchmarks/gpu/check.sh --list-sources   # what the direct build compiles into each
#                                                 # module (tests/python/test_nccl.py holds it
#                                                 # to CMake's targets)
# Environment: PYTHON (interpreter with torch), OUT (output folder), DRA_GPU_CHECK_BUILD
# (auto|pip|gxx), DRA_GPU_CHECK_BUILD_CAP_S (build time cap, default 300), DRA_NCCL_LIBRARY.
# Exit status: 0 all passed on a GPU; 1 a step failed; 2 bad usage; 3 no GPU (CPU steps passed).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

out="${OUT:-$root/build/gpu-check}"
py="${PYTHON:-}"
nproc_arg="auto"
max_bytes=$((1 << 30))
skip_build=0 skip_tests=0 skip_bench=0 prepare=0 installed=0 list_sources=0
budget="${DRA_GPU_CHECK_BUDGET_S:-470}"
build_cap="${DRA_GPU_CHECK_BUILD_CAP_S:-300}"  # 16 cores build in about 2 minutes
deps="$root/build/gpu-deps"

usage() { sed -n '2,34p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="${2:?--out needs a folder}"; shift 2 ;;
    --python) py="${2:?--python needs an interpreter}"; shift 2 ;;
    --nproc) nproc_arg="${2:?--nproc needs a number}"; shift 2 ;;
    --max-bytes) max_bytes="${2:?--max-bytes needs a number}"; shift 2 ;;
    --skip-build) skip_build=1; shift ;;
    --installed) skip_build=1; installed=1; shift ;;
    --skip-tests) skip_tests=1; shift ;;
    --skip-bench) skip_bench=1; shift ;;
    --prepare-deps) prepare=1; shift ;;
    --list-sources) list_sources=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "check.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$max_bytes" in ''|*[!0-9]*) echo "check.sh: --max-bytes must be a number of bytes" >&2; exit 2 ;; esac

# What CMake builds (CMakeLists.txt), for the direct compiler build: _core from dra::dra (src/,
# src/elastic, src/comm, src/comm/gloo; src/comm/nccl when nccl.h is found), dra::energy and every
# python/*_py.cpp but sim_py.cpp; _sim, the simulator's module (no torch), from sim_module.cpp,
# sim_py.cpp and registry_py.cpp.
core_sources() { ls src/*.cpp src/elastic/*.cpp src/comm/*.cpp src/comm/gloo/*.cpp src/energy/*.cpp python/*_py.cpp | grep -v '^python/sim_py\.cpp$'; }
nccl_sources() { ls src/comm/nccl/*.cpp; }
sim_sources() { echo python/sim_module.cpp python/sim_py.cpp python/registry_py.cpp; }
if [ "$list_sources" = 1 ]; then
  echo "core:" $(core_sources) $(nccl_sources)
  echo "sim:" $(sim_sources)
  exit 0
fi
if [ -z "$py" ]; then
  for candidate in "$root/.venv/bin/python" python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import torch' >/dev/null 2>&1; then py="$candidate"; break; fi
  done
fi
if [ -z "$py" ] || ! "$py" -c 'import torch' >/dev/null 2>&1; then
  echo "check.sh: no Python with torch found; pass --python" >&2; exit 2
fi
# Absolute (steps run from other folders), without resolving a venv's symlink.
py="$(cd "$(dirname "$(command -v "$py")")" && pwd)/$(basename "$py")"

# A venv's interpreter brings cmake and ninja along.
PATH="$(dirname "$(command -v "$py")"):$PATH"

say() { printf '[gpu-check %4ds] %s\n' "$(( $(date +%s) - start ))" "$*"; }
start=$(date +%s)

# ---- --prepare-deps: headers a bare GPU machine may lack, copied where `run` can carry them ----
if [ "$prepare" = 1 ]; then
  mkdir -p "$deps/include"
  eigen="${EIGEN3_INCLUDE_DIR:-/usr/include/eigen3}"
  [ -f "$eigen/Eigen/Core" ] || { echo "check.sh: Eigen headers not found at $eigen (set EIGEN3_INCLUDE_DIR)" >&2; exit 1; }
  rm -rf "$deps/include/eigen3" && cp -r "$eigen" "$deps/include/eigen3"
  pyb="$("$py" -c 'import pybind11; print(pybind11.get_include())' 2>/dev/null || true)"
  [ -n "$pyb" ] && rm -rf "$deps/include/pybind11" && cp -r "$pyb/pybind11" "$deps/include/pybind11"
  # Debian's header-only libraries dra's compiled part uses (nlohmann/json, LBFGSpp) and the Gloo
  # headers torch's ProcessGroupGloo.hpp includes (the torch wheel ships the library only).
  for h in nlohmann LBFGSpp gloo LBFGS.h LBFGSB.h; do
    [ -e "/usr/include/$h" ] && rm -rf "$deps/include/$h" && cp -r "/usr/include/$h" "$deps/include/$h"
  done
  nccl_h="$("$py" -c 'import nvidia, os; print(next(p for r in nvidia.__path__ for p in [os.path.join(r, "nccl", "include", "nccl.h")] if os.path.exists(p)))' 2>/dev/null || true)"
  [ -n "$nccl_h" ] && mkdir -p "$deps/nccl/include" && cp "$nccl_h" "$deps/nccl/include/"
  say "headers copied into ${deps#$root/} ($(du -sh "$deps" | cut -f1)); carry that path to the GPU machine"
  exit 0
fi

mkdir -p "$out"
site="$out/site"
summary="$out/summary.json"
: > "$out/steps.tsv"
left() { echo $(( budget - ($(date +%s) - start) )); }
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$out/steps.tsv"; }  # step status seconds note
bounded() {  # bounded CAP CMD...: runs CMD under min(CAP, what is left of the budget)
  local cap="$1"; shift
  local t; t=$(left); [ "$t" -gt "$cap" ] && t="$cap"
  [ "$t" -lt 10 ] && { echo "check.sh: out of time budget" >&2; return 124; }
  timeout --kill-after=10 "$t" "$@"
}

# ---- 0. what is here -------------------------------------------------------------------------
"$py" - > "$out/preflight.json" <<'EOF'
import json, shutil, subprocess, torch
def run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as exc:
        return f"unavailable: {exc}"
info = {
    "torch": torch.__version__,
    "torch_cuda": torch.version.cuda,
    "cuda_available": torch.cuda.is_available(),
    "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else [],
    "torch_nccl": (lambda v: ".".join(map(str, v)) if isinstance(v, tuple) else str(v))(torch.cuda.nccl.version()) if torch.cuda.is_available() else None,
    "nvidia_smi": run(["nvidia-smi", "-L"]) if shutil.which("nvidia-smi") else None,
    "nvcc": run(["nvcc", "--version"]).splitlines()[-1] if shutil.which("nvcc") else None,
    "cxx": run(["c++", "--version"]).splitlines()[0] if shutil.which("c++") else None,
}
print(json.dumps(info, indent=2))
EOF
gpu=$("$py" -c 'import torch; print(int(torch.cuda.is_available()))')
say "python $py; torch $("$py" -c 'import torch; print(torch.__version__)'); GPU: $([ "$gpu" = 1 ] && echo yes || echo no)"

# ---- 1. build into $site ---------------------------------------------------------------------
build_gxx() {
  # The extension built with the compiler directly: needs only g++, Python.h, torch, Eigen,
  # pybind11 headers (pip's, or the copy torch ships) and nccl.h + CUDA headers.
  local bdir="$out/build-gxx"; mkdir -p "$bdir" "$site/dra"
  local vars; vars="$("$py" - "$deps" <<'EOF'
import os, sys, sysconfig, torch, torch.utils.cpp_extension as ce
deps = sys.argv[1]
def first(paths, probe):
    return next((p for p in paths if p and os.path.exists(os.path.join(p, probe))), "")
tinc = ce.include_paths()
try:
    import pybind11; pyb = pybind11.get_include()
except ImportError:
    pyb = ""
nv = []
try:
    import nvidia; nv = [os.path.join(r, s, "include") for r in nvidia.__path__ for s in ("nccl", "cu13", "cu12", "cuda_runtime")]
except ImportError:
    pass
env = lambda k: os.environ.get(k, "")
nccl = first([os.path.join(env("NCCL_ROOT"), "include"), *nv, os.path.join(deps, "nccl", "include"), "/usr/include", "/usr/local/cuda/include"], "nccl.h")
cuda = first([os.path.join(env("CUDA_HOME"), "include"), "/usr/local/cuda/include", *nv, "/usr/include"], "cuda_runtime_api.h")
eigen = first([env("EIGEN3_INCLUDE_DIR"), "/usr/include/eigen3", "/usr/local/include/eigen3", os.path.join(deps, "include", "eigen3"), os.path.join(sys.prefix, "include", "eigen3")], "Eigen/Core")
pyb = first([pyb, os.path.join(deps, "include"), *tinc], "pybind11/pybind11.h")
print(f"TINC='{' '.join('-isystem ' + p for p in tinc)}'")
print(f"PYINC='{sysconfig.get_paths()['include']}'")
print(f"TLIB='{os.path.join(os.path.dirname(torch.__file__), 'lib')}'")
print(f"ABI='{int(torch._C._GLIBCXX_USE_CXX11_ABI)}'")
print(f"EXT='{sysconfig.get_config_var('EXT_SUFFIX')}'")
nlib = first([os.path.join(os.path.dirname(nccl), "lib")] if nccl else [], "libnccl.so.2")
print(f"NCCLLIB='{os.path.join(nlib, 'libnccl.so.2') if nlib else ''}'")
json = first([env("NLOHMANN_JSON_INCLUDE_DIR"), "/usr/include", "/usr/local/include", os.path.join(deps, "include")], "nlohmann/json.hpp")
lbfgs = first(["/usr/include", "/usr/local/include", os.path.join(deps, "include")], "LBFGSpp/Param.h")
gloo = first(["/usr/include", "/usr/local/include", os.path.join(deps, "include"), *tinc], "gloo/algorithm.h")
print(f"NCCLINC='{nccl}'"); print(f"CUDAINC='{cuda}'"); print(f"EIGENINC='{eigen}'"); print(f"PYBINC='{pyb}'")
print(f"JSONINC='{json}'"); print(f"LBFGSINC='{lbfgs}'"); print(f"GLOOINC='{gloo}'")
EOF
)" || return 1
  eval "$vars"
  [ -n "$EIGENINC" ] || { echo "check.sh: Eigen headers not found (set EIGEN3_INCLUDE_DIR, or run --prepare-deps where they exist and carry build/gpu-deps)" >&2; return 1; }
  [ -n "$PYBINC" ] || { echo "check.sh: pybind11 headers not found" >&2; return 1; }
  local v name
  for v in JSONINC:nlohmann/json LBFGSINC:LBFGSpp GLOOINC:gloo; do
    name="${v%%:*}"
    [ -n "${!name}" ] || { echo "check.sh: ${v#*:} headers not found (run --prepare-deps where they exist and carry build/gpu-deps)" >&2; return 1; }
  done
  # -isystem for a default folder (/usr/include) breaks libstdc++'s #include_next <stdlib.h>.
  inc() { local d; for d in "$@"; do case "$d" in ""|/usr/include|/usr/local/include) ;; *) printf -- '-isystem %s ' "$d" ;; esac; done; }
  local nccl_flags="" sources sim_sources
  sources=$(core_sources)
  sim_sources=$(sim_sources)
  if [ -n "$NCCLINC" ] && [ -n "$CUDAINC" ]; then
    nccl_flags="-DDRA_WITH_NCCL=1 $(inc "$NCCLINC" "$CUDAINC")"
    # The last dlopen candidate, as CMake does (torch's own copy is found first when loaded).
    [ -n "$NCCLLIB" ] && nccl_flags="$nccl_flags '-DDRA_NCCL_LIBRARY_HINT=\"$NCCLLIB\"'"
    sources="$sources $(nccl_sources)"
  else
    echo "check.sh: nccl.h or CUDA headers not found: building without the NCCL backend" >&2
  fi
  local version; version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
  local cxx="${CXX:-c++}"
  local flags="-O2 -std=c++17 -fPIC -fvisibility=hidden -D_GLIBCXX_USE_CXX11_ABI=$ABI -DDRA_WITH_TORCH=1 -DUSE_DISTRIBUTED -DUSE_C10D_GLOO $nccl_flags '-DDRA_VERSION_STRING=\"$version\"' '-DDRA_COMPILER_STRING=\"$($cxx -dumpfullversion 2>/dev/null | sed 's/^/GNU /')\"' -Iinclude -Ipython $(inc "$PYBINC" "$PYINC" "$EIGENINC" "$JSONINC" "$LBFGSINC" "$GLOOINC") $TINC"
  local sim_flags="-O2 -std=c++17 -fPIC -fvisibility=hidden -Iinclude -Ipython $(inc "$PYBINC" "$PYINC" "$EIGENINC" "$LBFGSINC")"
  local jobs; jobs=$(nproc 2>/dev/null || echo 4)
  mkdir -p "$bdir/sim"
  # shellcheck disable=SC2086
  printf '%s\n' $sources | xargs -P "$jobs" -I{} sh -c 'o="$1/$(echo "$2" | tr / _).o"; eval "$3 -c $2 -o $o" || exit 255' _ "$bdir" {} "$cxx $flags" || return 1
  # shellcheck disable=SC2086
  printf '%s\n' $sim_sources | xargs -P "$jobs" -I{} sh -c 'o="$1/$(echo "$2" | tr / _).o"; eval "$3 -c $2 -o $o" || exit 255' _ "$bdir/sim" {} "$cxx $sim_flags" || return 1
  local objs; objs=$(for s in $sources; do echo "$bdir/$(echo "$s" | tr / _).o"; done)
  # shellcheck disable=SC2086
  $cxx -shared -o "$site/dra/_core$EXT" $objs -L"$TLIB" -Wl,-rpath,"$TLIB" -ltorch_python -ltorch -ltorch_cpu -lc10 -ldl || return 1
  objs=$(for s in $sim_sources; do echo "$bdir/sim/$(echo "$s" | tr / _).o"; done)
  # shellcheck disable=SC2086
  $cxx -shared -o "$site/dra/_sim$EXT" $objs || return 1
}

build_pip() {
  # The project's own build (scikit-build-core + CMake), as a wheel unpacked into $site.
  rm -rf "$out/wheel" && mkdir -p "$out/wheel" || return 1
  "$py" -m pip wheel -q --no-build-isolation --no-deps --no-index -w "$out/wheel" . \
    -Cbuild-dir="$out/build-pip" || return 1
  "$py" - "$out/wheel" "$site" <<'EOF' || return 1
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/dra-*.whl")[0]
zipfile.ZipFile(wheel).extractall(sys.argv[2])
EOF
}

if [ "$skip_build" = 0 ]; then
  t0=$(date +%s)
  rm -rf "$site/dra" && mkdir -p "$site"
  how=""
  mode="${DRA_GPU_CHECK_BUILD:-auto}"  # auto | pip | gxx
  if [ "$mode" != gxx ] && "$py" -c 'import scikit_build_core, pybind11' >/dev/null 2>&1 && command -v cmake >/dev/null 2>&1; then
    say "building with scikit-build-core (pip wheel, no network)"
    if bounded "$build_cap" bash -c "$(declare -f build_pip); py='$py' out='$out' site='$site'; build_pip" > "$out/build.log" 2>&1; then
      how="pip"
    else
      say "pip build failed (see build.log); trying the direct compiler build"
    fi
  fi
  if [ -z "$how" ] && [ "$mode" != pip ]; then
    rm -rf "$site/dra" && mkdir -p "$site/dra"
    say "building with $(command -v "${CXX:-c++}") directly"
    if bounded "$build_cap" bash -c "$(declare -f build_gxx core_sources nccl_sources sim_sources); py='$py' out='$out' site='$site' deps='$deps'; cd '$root'; build_gxx" >> "$out/build.log" 2>&1; then
      cp -r python/dra/. "$site/dra/"
      how="g++"
    fi
  fi
  if [ -z "$how" ]; then
    record build failed $(( $(date +%s) - t0 )) "see build.log"
    say "build FAILED:"; tail -20 "$out/build.log"
  else
    record build ok $(( $(date +%s) - t0 )) "$how"
    say "built ($how) in $(( $(date +%s) - t0 )) s"
  fi
fi
[ "$installed" = 1 ] || export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$site"
# An editable install of dra elsewhere (scikit-build-core's redirecting finder sits in front of
# sys.path) must not shadow the build under test.
cat > "$site/sitecustomize.py" <<'EOF'
import sys
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "ScikitBuildRedirectingFinder"]
EOF
imported=0
if ! info=$(cd /tmp && "$py" -c 'import dra, json; print(json.dumps(dict(dra.build_info(), module=dra._core.__file__)))' 2>>"$out/build.log"); then
  record import failed 0 "import dra failed (see build.log)"
  say "import dra FAILED"; tail -5 "$out/build.log"
elif [ "$installed" = 0 ] && [[ "$info" != *"\"module\": \"$site/"* ]]; then
  record import failed 0 "dra was imported from elsewhere, not $site"
  say "import dra FAILED: not the build under test: $info"
else
  imported=1
  say "dra: $info"
  echo "$info" > "$out/build_info.json"
fi

# ---- 2. tests --------------------------------------------------------------------------------
if [ "$skip_tests" = 0 ] && [ "$imported" = 1 ]; then
  t0=$(date +%s)
  if ! "$py" -c 'import pytest' >/dev/null 2>&1; then
    record tests failed 0 "pytest is not installed"
  else
    extra=()
    "$py" -c 'import pytest_timeout' >/dev/null 2>&1 || extra=(-W ignore::pytest.PytestConfigWarning -W ignore::pytest.PytestUnknownMarkWarning)
    # --import-mode=append: the dra under test is the one in $site, not the checkout's python/.
    bounded 180 "$py" -m pytest tests/python/test_nccl.py -v -rs -p no:cacheprovider --import-mode=append \
      --junitxml="$out/tests.xml" "${extra[@]}" > "$out/tests.log" 2>&1
    rc=$?
    counts=$(tail -1 "$out/tests.log" | sed 's/=//g; s/^ *//; s/ *$//')
    record tests "$([ $rc = 0 ] && echo ok || echo failed)" $(( $(date +%s) - t0 )) "$counts"
    say "tests: $counts"
    [ $rc = 0 ] || grep -E "FAILED|Error" "$out/tests.log" | head -20
  fi
fi

# ---- 3. the elastic controller on real NCCL (one rank), DDP beside it, syncs, energy ----------
if [ "$skip_bench" = 0 ] && [ "$imported" = 1 ]; then
  t0=$(date +%s)
  # Without a GPU the same script runs over Gloo on the CPU, small (the script itself is checked).
  eargs=(--json "$out/elastic_gpu.json"); [ "$gpu" = 1 ] || eargs+=(--device cpu --quick --steps 5 --rounds 2)
  (cd /tmp && bounded 120 "$py" "$root/benchmarks/gpu/elastic_gpu.py" "${eargs[@]}") > "$out/elastic.log" 2>&1
  rc=$?
  record elastic "$([ $rc = 0 ] && echo ok || echo failed)" $(( $(date +%s) - t0 )) "$(tail -1 "$out/elastic.log" | cut -c1-160)"
  cat "$out/elastic.log"
fi

# ---- 4. benchmark: the NCCL suite (python -m dra.bench nccl; the same code path as on the CPU) ---
if [ "$skip_bench" = 0 ] && [ "$imported" = 1 ]; then
  t0=$(date +%s)
  if [ "$gpu" = 1 ]; then
    bench_budget=$(( $(left) - 150 )); [ "$bench_budget" -gt 150 ] && bench_budget=150
    [ "$bench_budget" -lt 20 ] && bench_budget=20
    nproc_n="$nproc_arg"; [ "$nproc_n" = auto ] && nproc_n=0
    args=(--mode real --json "$out/nccl.json" --nproc "$nproc_n" --max-bytes "$max_bytes" --budget-s "$bench_budget")
  else
    # No GPU: the same suite on the emulated library, small (the suite itself is checked).
    args=(--mode emulated --quick --json "$out/nccl.json")
  fi
  (cd /tmp && bounded 300 "$py" -m dra.bench nccl "${args[@]}") > "$out/bench.log" 2>&1
  rc=$?
  record bench "$([ $rc = 0 ] && echo ok || echo failed)" $(( $(date +%s) - t0 )) "$([ "$gpu" = 1 ] && echo real || echo emulated)"
  cat "$out/bench.log"
fi

# ---- summary ---------------------------------------------------------------------------------
"$py" - "$out" "$gpu" "$(( $(date +%s) - start ))" <<'EOF'
import json, os, sys
out, gpu, seconds = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
steps = []
for line in open(os.path.join(out, "steps.tsv")):
    name, status, secs, note = line.rstrip("\n").split("\t")
    steps.append({"step": name, "status": status, "seconds": int(secs), "note": note})
def load(name):
    path = os.path.join(out, name)
    return json.load(open(path)) if os.path.exists(path) else None
summary = {"gpu": gpu, "seconds": seconds, "steps": steps, "preflight": load("preflight.json"),
           "build_info": load("build_info.json"), "bench": load("nccl.json"), "elastic": load("elastic_gpu.json")}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=2)
lines = [f"dra GPU check: {'GPU' if gpu else 'NO GPU (CPU-side steps only)'}, {seconds} s"]
lines += [f"  {s['step']:<8} {s['status']:<7} {s['seconds']:>4} s  {s['note']}" for s in steps]
for part in ("elastic", "bench"):
    if not summary[part]:
        continue
    lines.append(f"  {part} (value vs baseline):")
    for r in summary[part]["results"]:
        base = r.get("baseline")
        tail = f"   vs {base['value']:.4g} ({base['name']})" if base else ""
        lines.append(f"    {r['name']:<36} {r['value']:>10.4g} {r['unit']:<6}{tail}")
text = "\n".join(lines)
open(os.path.join(out, "summary.txt"), "w").write(text + "\n")
print(text)
EOF
if grep -q $'\tfailed\t' "$out/steps.tsv"; then exit 1; fi
[ "$gpu" = 1 ] || exit 3
exit 0
