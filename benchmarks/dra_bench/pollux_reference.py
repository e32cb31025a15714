"""Runs Pollux's reference simulator (petuum/adaptdl, branch osdi21-artifact, simulator/), unmodified,
on a prefix of a workload, seeded, and writes what each job did as CSV. It runs under the
reference's own environment (Python 3.8, its requirements.txt), never under dra's:

    python3.8 pollux_reference.py --simulator ADAPTDL/simulator --workload W.csv --jobs 8 --seed 1 --csv OUT.csv

The reference is randomised (its genetic search draws from numpy's global generator); seeding
numpy and random before the first decision makes a run repeatable. Nothing of the reference is
patched: this script imports its modules and drives its Cluster the way its simulate() does.
"""

import argparse
import csv
import logging
import os
import random
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--simulator", required=True, help="the reference's simulator/ folder")
    ap.add_argument("--workload", required=True)
    ap.add_argument("--jobs", type=int, default=0, help="first N jobs of the workload (0: all)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--interval", type=int, default=60)
    ap.add_argument("--csv", required=True, help="per-job output")
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.simulator))
    import numpy as np
    import pandas

    logging.disable(logging.CRITICAL)
    import simulator as ref
    from pollux import PolluxPolicy

    random.seed(a.seed)
    np.random.seed(a.seed)
    workload = pandas.read_csv(a.workload)
    if a.jobs:
        workload = workload.iloc[: a.jobs]
    cluster = ref.Cluster(workload, PolluxPolicy(), 16, num_gpus=4)
    start = time.time()
    while not cluster.all_complete():
        cluster.step(a.interval)
        done = sum(j.completion_time is not None for j in cluster.jobs)
        print(f"t={cluster.current_time} done={done}/{len(cluster.jobs)} wall={time.time() - start:.0f}s",
              file=sys.stderr, flush=True)
    with open(a.csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "application", "submit_s", "completion_s", "jct_s", "restarts"])
        for j in cluster.jobs:
            w.writerow([j.name, j.application.name, j.submission_time, j.completion_time,
                        j.completion_time - j.submission_time, j.num_restarts])
    print(f"wall_s={time.time() - start:.1f}", file=sys.stderr)


if __name__ == "__main__":
    main()
