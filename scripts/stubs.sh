#!/usr/bin/env bash
# Regenerates the type stubs of the compiled modules (python/dra/_core/*.pyi, python/dra/_sim.pyi) from the build with
# pybind11-stubgen. The test suite checks that the committed stubs match the build
# (tests/python/test_stubs.py): run this after changing a binding.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
"$root/.venv/bin/pybind11-stubgen" dra._core -o "$out" --exit-code >/dev/null
rm -f "$root"/python/dra/_core/*.pyi
mkdir -p "$root/python/dra/_core"
cp "$out"/dra/_core/*.pyi "$root/python/dra/_core/"
"$root/.venv/bin/pybind11-stubgen" dra._sim -o "$out" --exit-code >/dev/null
cp "$out"/dra/_sim.pyi "$root/python/dra/_sim.pyi"
echo "stubs: $(ls "$root"/python/dra/_core/*.pyi | wc -l) files in python/dra/_core/"
