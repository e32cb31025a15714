"""``python -m dra.rl.live.coordinator`` (or ``python -m dra.rl.live.cli``): one live RL run, or
several, from the command line (docs/guide/rl.md, "Live")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dra._argtypes import count_arg, nonnegative_int_arg, positive_arg
from dra.rl.live.config import LiveConfig
from dra.rl.live.coordinator import LiveRL
from dra.sim._args import check_output_path, check_plotting


def main(argv: list[str] | None = None) -> int:
    import argparse

    slots = LiveConfig().slots
    parser = argparse.ArgumentParser(prog="python -m dra.rl.live.coordinator", description="One live RL run (or several).")
    parser.add_argument("--out", default="out/rl-live")
    parser.add_argument("--steps", type=count_arg, default=10)
    parser.add_argument("--rollout", type=count_arg, action="append",
                        help=f"static split(s) to run (rollout slots, 1-{slots - 1} of {slots})")
    parser.add_argument("--dynamic", action="store_true", help="also run the stage-balance policy")
    parser.add_argument("--no-cgroups", action="store_true")
    parser.add_argument("--cpus-per-slot", type=positive_arg, default=0.2)
    parser.add_argument("--pretrain-steps", type=nonnegative_int_arg, default=400)
    parser.add_argument("--plots", metavar="DIR", help="write the runs' reward curves (rl-live-rewards-<steps>.png) into DIR")
    args = parser.parse_args(argv)
    # Everything checked before the warm-up and the workers, which take minutes.
    if not args.rollout and not args.dynamic:
        parser.error("nothing to run; give --rollout N (a static split, repeatable) and/or --dynamic")
    for r in args.rollout or []:
        if r >= slots:
            parser.error(f"argument --rollout: {r} leaves no slot to train; give 1-{slots - 1} ({slots} slots)")
    try:
        check_output_path("--out", args.out, folder=True)
        if args.plots is not None:
            check_output_path("--plots", args.plots, folder=True)
            check_plotting("--plots")
        cfg = LiveConfig(steps=args.steps, use_cgroups=not args.no_cgroups, cpus_per_slot=args.cpus_per_slot,
                         pretrain_steps=args.pretrain_steps)
        cfg.validate()
    except ValueError as e:
        parser.error(str(e))
    runs = []
    try:
        with LiveRL(cfg, args.out) as live:  # its close() stops the workers and removes their cgroups
            for r in args.rollout or []:
                runs.append(live.run(f"static-{r}", r))
            if args.dynamic:
                runs.append(live.run("dynamic", None))
    except KeyboardInterrupt:
        print(f"[dra.rl live] interrupted after {len(runs)} complete run(s); its workers are stopped and cleaned up",
              file=sys.stderr)
        return 130
    with open(Path(args.out) / "runs.json", "w") as f:
        json.dump(runs, f, indent=1, default=str)
    if args.plots:
        from dra.rl.plots import plot_rewards

        plot_rewards({r["name"]: r for r in runs}, [], Path(args.plots) / f"rl-live-rewards-{args.steps}.png", window=10)
    for r in runs:
        print(f"{r['name']}: {r['samples_per_s']:.3f} samples/s, {r['total_s']:.1f} s, switches {r['switches']}, "
              f"exactly once {r['ledger']['exactly_once']}, rewards {r['rewards'][0]:.3f} -> {r['rewards'][-1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
