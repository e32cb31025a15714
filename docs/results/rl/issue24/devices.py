"""Out-of-sample check of the stage-balance policy at 4 and 16 devices (simulated, 120 steps,
seeds 1-2):

    .venv/bin/python docs/results/rl/issue24/devices.py

Rows: scenario, trace override ("conv": Azure conversation lengths without drift), seed, devices,
the policy and the within-step oracle over the best static barrier-free split, that split, and
the policy's mean rollout devices.
"""

from concurrent.futures import ProcessPoolExecutor

import dra.rl as rl


def one(case: tuple[str, int, int, str]) -> tuple[str, str, int, int, float, float, int, float]:
    scenario, seed, devices, trace = case
    kw: dict = {"trace": "conv", "workload": {"updates_per_step": 4}} if trace == "conv" else {}
    d = rl.simulate_pipeline(scenario, seed=seed, steps=120, devices=devices, **kw)
    runs = d["barrier_free"]
    best = min(range(len(runs)), key=lambda i: runs[i]["total_s"])
    t = runs[best]["total_s"]
    return (scenario, trace, seed, devices, d["dynamic"]["total_s"] / t, d["oracle_within_step"]["total_s"] / t,
            runs[best]["rollout"], d["dynamic"]["mean_rollout_devices"])


if __name__ == "__main__":
    settings = [("azure_code", ""), ("azure_conv_drift", ""), ("azure_code", "conv"), ("longgen_reserve", "")]
    cases = [(s, k, dv, e) for (s, e) in settings for k in (1, 2) for dv in (4, 16)]
    with ProcessPoolExecutor(2) as ex:
        for row in ex.map(one, cases):
            scenario, trace, seed, devices, policy, oracle, best, mean_r = row
            print(f"{scenario:17s} {trace:4s} seed {seed} dev {devices:2d}: policy x{policy:.3f} oracle x{oracle:.3f} "
                  f"best_r {best} mean_r {mean_r:.2f}", flush=True)
