#!/usr/bin/env bash
# Checks the house style: ruff's lint rules (settings in pyproject.toml) over the Python code and
# clang-format (settings in .clang-format) over the C++ code. Python layout is not machine
# formatted: ruff format would re-wrap most files (many lines run to 120-160 characters by design).
# Read-only; `scripts/lint.sh --fix` rewrites the files in place. Called by scripts/test.sh.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
venv="${DRA_VENV:-$root/.venv}"
fix=0
if [[ "${1:-}" == "--fix" ]]; then fix=1; elif [[ $# -gt 0 ]]; then
  echo "usage: scripts/lint.sh [--fix]   (unknown argument '$1')" >&2; exit 2
fi
for tool in ruff clang-format; do
  if [[ ! -x "$venv/bin/$tool" ]]; then
    echo "lint: $venv/bin/$tool is missing; run ./scripts/setup.sh (requirements-dev.txt pins it)" >&2
    exit 2
  fi
done
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t cxx < <(git ls-files '*.cpp' '*.hpp' '*.h' ':!:data/*')
else  # a copy without git: the project's own C++ folders
  mapfile -t cxx < <(find include src python tests examples benchmarks -name '*.cpp' -o -name '*.hpp' -o -name '*.h' | sort)
fi
if [[ $fix == 1 ]]; then
  "$venv/bin/ruff" check --fix . || true  # what it cannot fix is listed, then fixed by hand
  "$venv/bin/clang-format" -i "${cxx[@]}"
  exit 0
fi
status=0
echo "lint: ruff check"; "$venv/bin/ruff" check . || status=1
echo "lint: clang-format (${#cxx[@]} files)"
if ! "$venv/bin/clang-format" --dry-run -Werror "${cxx[@]}" 2>/tmp/dra-clang-format.$$; then
  grep -o '^[^:]*:' /tmp/dra-clang-format.$$ | sort -u | head -20 | sed 's/:$/: not clang-formatted/' >&2
  status=1
fi
rm -f /tmp/dra-clang-format.$$
if [[ $status != 0 ]]; then echo "lint: failed; scripts/lint.sh --fix rewrites the files" >&2; fi
exit $status
