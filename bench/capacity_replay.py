"""Re-read a capacity series' stored levels with the stage's capacity rule (`measure.serving.capacity`).

    python bench/capacity_replay.py bench/results/serving/2026-11-27/h100-b-capacity.json.gz

For each run of ``serving_load.py --sections capacity`` (its ``short`` runs), the confirmation levels it measured
are read as the stage now reads them (`capacity.crossing`, `capacity.capacity_interval`), and the spread of the
runs printed: what the rule makes of levels a walk chose, apart from which levels the staircase would have run.
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
from pathlib import Path


def main(paths: list[str]) -> int:
    from trtflow_stages.measure.serving.capacity import capacity_interval, crossing

    for path in paths:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(Path(path), "rt") as handle:
            series = json.load(handle)
        answers = []
        for index, run in enumerate(series["short"]):
            levels = [entry for entry in run["open_loop"] if entry.get("confirmation")]
            budget = run["max_rate_meeting_budget"][0]["latency_budget_ms"]
            value, meets, misses = crossing(levels, budget)
            interval, _ = capacity_interval(levels, budget, seed=0)
            answers.append(value)
            print(f"{path}: run {index + 1}: {len(levels)} levels, capacity "
                  f"{'none' if value is None else f'{value:.1f}'} (90% interval {interval}, between {meets} and "
                  f"{misses})")
        found = [a for a in answers if a is not None]
        if found:
            middle = statistics.median(found)
            print(f"{path}: min {min(found):.1f}, median {middle:.1f}, max {max(found):.1f}, range "
                  f"{(max(found) - min(found)) / middle:.1%} of the median, {len(found)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
