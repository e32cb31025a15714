"""The pool's metrics in the Prometheus text exposition format (0.0.4), from its status."""

from __future__ import annotations

from typing import Any


def _label(value: Any) -> str:
    """A label value as the format writes it: backslash, double quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus(st: dict[str, Any]) -> str:
    name = _label(st["pool"])
    lines = [
        "# HELP dra_pool_devices Devices in the pool.", "# TYPE dra_pool_devices gauge",
        f'dra_pool_devices{{pool="{name}"}} {len(st["devices"])}',
        "# HELP dra_pool_devices_leased Device shares held by leases.", "# TYPE dra_pool_devices_leased gauge",
        f'dra_pool_devices_leased{{pool="{name}"}} {sum(1 - d["free"] for d in st["devices"]):g}',
        "# HELP dra_pool_devices_away Devices of nodes away with a Ray cluster's head (leases kept, nothing granted).",
        "# TYPE dra_pool_devices_away gauge",
        f'dra_pool_devices_away{{pool="{name}"}} {len(st.get("away") or [])}',
        "# HELP dra_pool_devices_away_leased Device shares held by leases on devices away.",
        "# TYPE dra_pool_devices_away_leased gauge",
        f'dra_pool_devices_away_leased{{pool="{name}"}} {sum(1 - d["free"] for d in st.get("away") or []):g}',
        "# HELP dra_pool_job_workers Workers (active leases) per job.", "# TYPE dra_pool_job_workers gauge",
    ]
    for j in st["jobs"]:
        if j["state"] in ("waiting", "running"):
            lines.append(f'dra_pool_job_workers{{pool="{name}",job="{_label(j["name"])}",state="{j["state"]}"}} {j["workers"]}')
    services = [j for j in st["jobs"] if j["kind"] == "inference" and j["state"] == "running"]
    for family, key, what in (
            ("dra_pool_inference_replicas_wanted", "replicas_wanted", "Replicas each inference service's autoscaler wants."),
            ("dra_pool_inference_load_rps", "load_rps",
             "Requests per second each inference service reported (to its owner and operators)."),
            ("dra_pool_inference_queue", "queue", "Queued requests each inference service reported (to its owner and "
                                                  "operators).")):
        shown = [j for j in services if isinstance(j.get(key), (int, float)) and not isinstance(j.get(key), bool)]
        if shown:
            lines += [f"# HELP {family} {what}", f"# TYPE {family} gauge"]
            lines += [f'{family}{{pool="{name}",job="{_label(j["name"])}"}} {j[key]:g}' for j in shown]
    lines += ["# HELP dra_pool_jobs Jobs per state.", "# TYPE dra_pool_jobs gauge"]
    states: dict[str, int] = {}
    for j in st["jobs"]:
        states[j["state"]] = states.get(j["state"], 0) + 1
    for s, n in sorted(states.items()):
        lines.append(f'dra_pool_jobs{{pool="{name}",state="{s}"}} {n}')
    lines += ["# HELP dra_pool_events_total Grants, releases, preemptions, reclaims and moves.",
              "# TYPE dra_pool_events_total counter"]
    for k, v in sorted(st["counters"].items()):
        lines.append(f'dra_pool_events_total{{pool="{name}",kind="{k}"}} {v}')
    if st["cpu_usage_s"]:
        lines += ["# HELP dra_pool_slot_cpu_seconds_total CPU seconds used in each slot (cgroup cpuacct).",
                  "# TYPE dra_pool_slot_cpu_seconds_total counter"]
        for s, v in sorted(st["cpu_usage_s"].items()):
            lines.append(f'dra_pool_slot_cpu_seconds_total{{pool="{name}",slot="{_label(s)}"}} {v:.6f}')
    return "\n".join(lines) + "\n"
