#!/usr/bin/env bash
# Sets everything up (idempotent), then runs the main job on its embedded default.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
"$root/scripts/setup.sh"
# The main job: the device pool at work on this machine (needs root for the cgroup CPU slots):
# six training jobs arriving over time (two rounds of three) and an inference service replaying the Azure LLM
# inference trace share 4 CPU slots, run under the operator's static baseline (requests held for
# life, priority FCFS with backfilling; inference sized for its peak) and dynamic (dra's pool).
# Extra arguments go to it (e.g. --out DIR, --modes static_naive,static,dynamic). The digits
# elastic example is examples/digits_elastic.py; the single-process tour examples/digits_single.py.
exec .venv/bin/python examples/pool/pool_at_work.py "$@"
