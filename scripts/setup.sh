#!/usr/bin/env bash
# Idempotent setup for a fresh machine: system headers, the project's .venv, and the dra package.
# Safe to run again and again; each step is skipped when its inputs have not changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# ccache keys on paths relative to the checkout, so that two checkouts share the cache (see step 3).
export CCACHE_BASEDIR="$root"
say() { printf '[setup] %s\n' "$*"; }

# 1. C++ dependencies from Debian: Eigen (dra::core), doctest (C++ tests), and the Gloo headers
#    that torch's ProcessGroupGloo.hpp includes (the torch wheel ships the library, not the headers).
#    LBFGSpp (header-only): fits Pollux's throughput model online (include/dra/policy/perf_model.hpp).
#    ccache: the test command's C++ build compiles the library's sources again with the same flags;
#    with ccache they come out of the cache this build fills (CI: about 4 minutes saved).
#    faketime (libfaketime): tests/python/test_clock_outside.py steps one process's wall clock.
missing=()
for pkg in libeigen3-dev doctest-dev libgloo-dev nlohmann-json3-dev liblbfgspp-dev ccache faketime; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing Debian packages ${missing[*]}; run as root or: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
  say "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# 2. The Python environment (.venv at the repository root).
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  python3 -m venv .venv
fi
req_hash="$(sha256sum requirements-dev.txt | cut -c1-16)"
if [ "$(cat .venv/.req-stamp 2>/dev/null)" != "$req_hash" ]; then
  say "installing Python requirements (torch pinned to the CPU wheel)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements-dev.txt
  # zeus pulls in amdsmi, whose import fails without ROCm (libamd_smi.so) and then breaks Ray's
  # accelerator detection at import; dra uses only zeus's trace-driven simulator, which needs none
  # of it.
  .venv/bin/python -m pip uninstall -q -y amdsmi 2>/dev/null || true
  echo "$req_hash" > .venv/.req-stamp
fi

# 3. The dra package itself, built against the installed torch (no isolated build env, which
#    would fetch another torch). Rebuilt only when a C++/build input changed. The lock keeps
#    concurrent setups (several shells, CI steps) from sharing one half-built tree.
src_hash="$( (cat pyproject.toml CMakeLists.txt; find include src python cmake -type f \
  \( -name '*.hpp' -o -name '*.cpp' -o -name '*.txt' -o -name '*.in' -o -name '*.cmake' \) \
  -print0 | sort -z | xargs -0 cat) | sha256sum | cut -c1-16)"
exec 9>"$root/.venv/.build-lock"
flock 9
if [ "$(cat .venv/.pkg-stamp 2>/dev/null)" != "$src_hash" ] || ! .venv/bin/python -c 'import dra._core' 2>/dev/null; then
  say "building and installing dra (C++ extension; first build takes a few minutes)"
  .venv/bin/python -m pip install -q --no-build-isolation --no-deps -e . \
    -Cbuild-dir=build/py -Ccmake.define.DRA_BUILD_TESTS=OFF -Ccmake.define.CMAKE_EXPORT_COMPILE_COMMANDS=ON \
    -Ccmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache
  echo "$src_hash" > .venv/.pkg-stamp
fi
flock -u 9

# 4. The benchmark suites (benchmarks/dra_bench) are benchmark code, not part of the package: a path
#    file puts them on this venv's path, so `python -m dra.bench <suite>` and its workers find them.
site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$root/benchmarks" > "$site/dra_benchmarks.pth"
say "ready: $(.venv/bin/python -c 'import dra, json; print(json.dumps(dra.build_info()))')"
