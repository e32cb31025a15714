"""A cluster policy of your own for the simulator, as a plugin file (docs/guide/simulator.md,
"Your own cluster policy"): every job that has arrived gets an equal share of the cluster, up to
its max_devices, and what the shares leave over goes to the first jobs that can take it.

    dra-sim replay --plugin examples/sim/equal_share.py --policy equal_share --policy pollux \\
        --workload data/pollux/workloads/workload-6.csv
"""

import dra.sim


def equal_share(inputs) -> list[int]:
    jobs = inputs.jobs  # the arrived jobs' views, valid during this call only
    if not jobs:
        return []
    share = inputs.capacity // len(jobs)
    counts = [min(share, j["max_devices"]) for j in jobs]
    left = inputs.capacity - sum(counts)
    for i, j in enumerate(jobs):
        extra = min(left, j["max_devices"] - counts[i])
        counts[i] += extra
        left -= extra
    return counts


dra.sim.add_cluster_policy("equal_share", equal_share, "equal shares, leftovers to the first jobs that can take them")
