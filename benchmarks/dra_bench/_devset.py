"""The development workloads issue 21's cluster policy was tuned on (never the evaluation files):
rows drawn from the eight shipped 1.0x Pollux workloads, 160 x load jobs arriving uniformly over
8 hours, seeds 101-105 x loads 0.5, 1 and 2 (15 files).

    .venv/bin/python -m dra_bench._devset OUT_DIR
"""

from __future__ import annotations

import csv
import random
import sys
from pathlib import Path

import dra.sim as sim


def write_devset(out: str | Path, seeds: tuple[int, ...] = (101, 102, 103, 104, 105),
                 loads: tuple[float, ...] = (0.5, 1.0, 2.0)) -> list[Path]:
    pool: list[dict[str, str]] = []
    for i in range(1, 9):
        with open(sim.default_data_dir() / "workloads" / f"workload-{i}.csv") as fh:
            pool += list(csv.DictReader(fh))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for seed in seeds:
        for load in loads:
            rng = random.Random(seed * 10 + int(load * 2))
            n = int(160 * load)
            rows = [dict(rng.choice(pool)) for _ in range(n)]
            times = sorted(rng.randrange(0, 28800) for _ in range(n))
            path = out / f"dev-{seed}-{load}.csv"
            with open(path, "w", newline="") as fh:
                w = csv.writer(fh)
                w.writerow(["name", "time", "application", "num_replicas", "batch_size"])
                for k, (r, t) in enumerate(zip(rows, times)):
                    w.writerow([f"{r['application']}-{k}", t, r["application"], r["num_replicas"], r["batch_size"]])
            written.append(path)
    return written


if __name__ == "__main__":
    for p in write_devset(sys.argv[1] if len(sys.argv) > 1 else "devset"):
        print(p)
