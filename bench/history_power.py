"""What the nightly history's change-point detection finds, and how often it cries wolf.

Seeded synthetic series (``trtflow.history.power``: one figure per run, log-normal run-to-run noise) through the
project's own detector (`trtflow.history.changes`, Apache Otava) and nightly check (`trtflow.history.trend.check`,
what ``trtflow history --check`` runs):

1. detection: a step of 5-20% at run 20 of 30: the share of series with a change point within 2 runs of it; and
   the share of unchanged 30-run series with any change point (false alarms);
2. the check (threshold 10%, latest 5 runs, 2 runs after the change): after 25 unchanged nights, a step of 0-20%
   from the next night on; the share of trials failed by the 1st..5th night after it (step 0: false alarms), also
   with busy nights (each night 25% slower on its own with probability 5%).

    python bench/history_power.py --trials 1000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    from trtflow.history.power import check_rates, detection_rates

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--noise", type=float, nargs="+", default=[0.02, 0.03, 0.05, 0.07])
    parser.add_argument("--steps", type=float, nargs="+", default=[0.0, 0.05, 0.10, 0.15, 0.20])
    parser.add_argument("--threshold", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=None, help="write the rates as JSON here")
    args = parser.parse_args()
    started = time.perf_counter()
    results: dict[str, list] = {"detection": [], "check": []}
    print(f"== detection: 30 runs, step at run 20, found within 2 runs ({args.trials} series each)")
    print("  noise  step   found  any change point")
    for noise in args.noise:
        for step in args.steps:
            found = detection_rates(args.trials, 30, noise, step, 20, seed=int(noise * 1000 + step * 100))
            results["detection"].append({"noise": noise, "step": step, "found": found.found,
                                         "any_change": found.any_change})
            print(f"  {noise:5.0%}  {step:4.0%}  {found.found:6.1%}  {found.any_change:6.1%}", flush=True)
    print(f"\n== nightly check: threshold {args.threshold:g}%, latest 5, 2 runs after; 25 unchanged nights, then the "
          f"step ({args.trials // 2} trials each): failed by night 1..5")
    print("  noise  step  busy nights  by night 1..5")
    for noise in args.noise:
        for step in args.steps:
            for busy in ((0.0, 0.05) if step == 0 else (0.0,)):
                power = check_rates(args.trials // 2, 25, noise, step, args.threshold, outliers=busy,
                                    seed=int(noise * 1000 + step * 100 + busy * 10000))
                results["check"].append({"noise": noise, "step": step, "busy": busy,
                                         "failed_by_night": list(power.failed_by_night)})
                print(f"  {noise:5.0%}  {step:4.0%}  {busy:11.0%}  "
                      + "  ".join(f"{rate:6.1%}" for rate in power.failed_by_night), flush=True)
    print(f"\n{time.perf_counter() - started:.0f} s")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
