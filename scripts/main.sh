#!/usr/bin/env bash
# Sets everything up (idempotent), then runs the main job on its embedded default.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
"$root/scripts/setup.sh"
exec .venv/bin/python examples/digits_single.py "$@"
