#!/usr/bin/env bash
# The C++ doctest suites under AddressSanitizer and UndefinedBehaviorSanitizer (a developer check,
# not part of scripts/test.sh: the instrumented build takes 20-60 minutes on 2 cores).
#
#   scripts/sanitize.sh          # the torch-free core's suites (dra::core, dra::sim): ~20 min
#   scripts/sanitize.sh --torch  # also the compiled part's (elastic, comm, NCCL emulation): ~60 min
#
# Any sanitizer report fails the test it came from (-fno-sanitize-recover); leaks are checked in
# the core's suites (LibTorch's own allocations at exit would drown the compiled part's).
# Needs ./scripts/setup.sh first (the venv's cmake, ninja and torch).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
torch=0
if [[ "${1:-}" == "--torch" ]]; then torch=1; elif [[ $# -gt 0 ]]; then
  echo "usage: scripts/sanitize.sh [--torch]   (unknown argument '$1')" >&2; exit 2
fi
if [[ ! -x .venv/bin/cmake ]]; then
  echo "sanitize: .venv/bin/cmake is missing; run ./scripts/setup.sh first" >&2; exit 2
fi
export PATH="$root/.venv/bin:$PATH" CCACHE_BASEDIR="$root"
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1"
jobs="$(nproc)"
common=(-G Ninja -DCMAKE_BUILD_TYPE=Debug -DDRA_BUILD_TESTS=ON -DDRA_BUILD_EXAMPLES=OFF
        -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
        -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [[ $torch == 0 ]]; then
  dir=build/sanitize-core
  cmake -S . -B "$dir" "${common[@]}" -DDRA_WITH_TORCH=OFF >/dev/null
  export ASAN_OPTIONS=detect_leaks=1
else
  dir=build/sanitize-torch
  torch_prefix="$(.venv/bin/python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
  cmake -S . -B "$dir" "${common[@]}" -DCMAKE_PREFIX_PATH="$torch_prefix" \
    -DPython_EXECUTABLE="$root/.venv/bin/python" >/dev/null
  export ASAN_OPTIONS=detect_leaks=0
fi
echo "== sanitize: build $dir (ASan + UBSan) =="
cmake --build "$dir" -j "$jobs"
echo "== sanitize: ctest =="
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir "$dir" --output-on-failure -j "$jobs" --timeout 600
