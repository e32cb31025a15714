"""The stage-balance policy and the within-step oracle against the best static barrier-free split,
per scenario and seed, in the event model (simulated, 200 steps, 8 devices):

    .venv/bin/python docs/results/rl/issue24/seeds.py azure_code,azure_conv_drift,longgen_reserve,longgen 1,2,3,4,5,6

Each case is one `dra.rl.simulate_pipeline(scenario, seed=k, steps=200)`; two at once.
"""

import sys
import time
from concurrent.futures import ProcessPoolExecutor

import dra.rl as rl


def one(case: tuple[str, int]) -> tuple[str, int, float, float, int, float, float]:
    scenario, seed = case
    t = time.time()
    d = rl.simulate_pipeline(scenario, seed=seed, steps=200)
    best = min(r["total_s"] for r in d["barrier_free"])
    dyn = d["dynamic"]
    return (scenario, seed, dyn["total_s"] / best, d["oracle_within_step"]["total_s"] / best, dyn["switches"],
            dyn["mean_rollout_devices"], time.time() - t)


if __name__ == "__main__":
    scenarios = sys.argv[1].split(",") if len(sys.argv) > 1 else ["azure_code", "azure_conv_drift", "longgen_reserve", "longgen"]
    seeds = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else [1, 2, 3]
    with ProcessPoolExecutor(2) as ex:
        for scenario, seed, dyn, orc, switches, mean_r, elapsed in ex.map(one, [(s, k) for s in scenarios for k in seeds]):
            share = f"{(1 - dyn) / (1 - orc):+.0%}" if orc < 0.999 else "n/a"
            print(f"{scenario:18s} seed {seed}: policy x{dyn:.3f} oracle x{orc:.3f} share {share} "
                  f"switches {switches} mean rollout {mean_r:.2f} ({elapsed:.0f} s)", flush=True)
