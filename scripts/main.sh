#!/usr/bin/env bash
# Sets everything up (idempotent), then runs the main job on its embedded default.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
"$root/scripts/setup.sh"
# The main job: elastic training on the digits data under torchrun (4 processes), resized in place
# by the convergence policy, compared with a static 4-process run. Extra arguments go to it
# (e.g. --out DIR, --nproc N, --epochs N). The single-process tour is examples/digits_single.py.
exec .venv/bin/python examples/digits_elastic.py "$@"
