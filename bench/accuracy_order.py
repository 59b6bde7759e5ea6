"""Does select order candidates "by accuracy" only where they differ? Its own code driven by seeded error models.

Every trial makes one reference output (rows x elements, the validation's samples) and two candidates' outputs: the
reference plus an error drawn from a model (`MODELS`), the second candidate's error scaled by ``1 + worse``. Each
pair goes through what the ``validate`` and ``select`` stages run: the record `accuracy.compare.measure_outputs`
writes (Polygraphy's figures by their definitions, the uncertainty by `accuracy.resolution.figure_uncertainty`),
`decision.candidates.accuracy_of` (a validate.json's figures
and their uncertainty) and `decision.tie_breakers.more_accurate` (one candidate more accurate than the other beyond
the figures' resolution and spread). Nothing but numpy and the stages' code; thousands of trials take a minute.

What is counted, per error model and size:

- ``worse`` 0 (two statistically identical candidates): how often one is ordered before the other (``ordered``),
  which should be rare (a 95% interval on each figure: at most 5%);
- ``worse`` 0.5% and 1%: how often the *worse* one is ordered first (``wrong``), at most 5%;
- ``worse`` 20% and 50%: how often the better one is ordered first (``found``): the power, stated, not a goal.

Error models (`MODELS`), each an error scale of 1e-3 against a reference of unit scale:

- ``gauss``: independent normal errors;
- ``heavy``: Student's t with 3 degrees of freedom (heavy tails: the maximum moves far between draws);
- ``rows``: normal errors whose scale differs per row (log-normal, sigma 0.5): some samples are harder;
- ``outliers``: normal errors, 0.5% of elements 20x larger (a few badly quantized values);
- ``grid``: uniform errors (rounding to a grid, as a quantized tensor's are): a bounded maximum.

    python bench/accuracy_order.py --trials 400
    python bench/accuracy_order.py --trials 400 --rule before  # the rules before: the max's spread the gap between
                                                               # the two largest per-row maxima, 95% per figure, the
                                                               # max judged alone
    python bench/accuracy_order.py --trials 400 --out bench/results/accuracy-order/rows.json

Exit code 1 when a goal fails: ``ordered`` at most 5% where ``worse`` is 0, ``wrong`` at most 5% where it is 0.5% or
1%, in every model and size.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

SCALE = 1e-3
#: (rows, elements per row): a small validation (16 samples of a classifier's logits), a larger one.
SIZES = ((16, 1000), (64, 256))
WORSE = (0.0, 0.005, 0.01, 0.2, 0.5)
GOAL = 0.05


def _gauss(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    return rng.normal(0.0, SCALE, shape)


def _heavy(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    return SCALE * rng.standard_t(3, shape) / math.sqrt(3.0)


def _rows(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    return rng.normal(0.0, SCALE, shape) * rng.lognormal(0.0, 0.5, (shape[0], 1))


def _outliers(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    error = rng.normal(0.0, SCALE, shape)
    return np.where(rng.random(shape) < 0.005, 20.0 * error, error)


def _grid(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    return rng.uniform(-SCALE * math.sqrt(3.0), SCALE * math.sqrt(3.0), shape)


MODELS: dict[str, Callable[[np.random.Generator, tuple[int, int]], np.ndarray]] = {
    "gauss": _gauss, "heavy": _heavy, "rows": _rows, "outliers": _outliers, "grid": _grid}


def _gap_rule(maxima: Any) -> float:
    """The rule before: the gap between the two largest per-row maxima."""
    values = np.sort(np.asarray(maxima, dtype=np.float64))
    return float(values[-1] - values[-2]) if values.size >= 2 else 0.0


def _figures(reference: np.ndarray, candidate: np.ndarray) -> dict[str, Any]:
    """One output's record as `accuracy.compare.measure_outputs` writes it, for the figures a decision reads:
    Polygraphy's definitions (the largest and the mean absolute difference, the cosine similarity over the whole
    output) in numpy (Polygraphy's comparator costs 20 ms a call), and the stage's own uncertainty
    (`accuracy.resolution.figure_uncertainty`)."""
    from trtflow_stages.accuracy.resolution import figure_uncertainty

    error = np.abs(candidate.astype(np.float64) - reference.astype(np.float64))
    r, c = reference.ravel().astype(np.float64), candidate.ravel().astype(np.float64)
    return {"elements": int(reference.size), "max_abs_error": float(error.max()),
            "mean_abs_error": float(error.mean()),
            "cosine_similarity": float(r @ c / (np.linalg.norm(r) * np.linalg.norm(c))),
            **figure_uncertainty(reference, candidate)}


def trial(rng: np.random.Generator, model: str, rows: int, elements: int, worse: float) -> tuple[bool, bool]:
    """(the first candidate more accurate, the second more accurate): the second's error is ``1 + worse`` times
    larger in scale."""
    from trtflow_stages.decision.candidates import accuracy_of
    from trtflow_stages.decision.tie_breakers import more_accurate

    shape = (rows, elements)
    reference = rng.normal(0.0, 1.0, shape).astype(np.float32)
    draw = MODELS[model]
    first = (reference + draw(rng, shape)).astype(np.float32)
    second = (reference + (1.0 + worse) * draw(rng, shape)).astype(np.float32)
    figures = [accuracy_of({"passed": True, "outputs": {"y": _figures(reference, out)}}, name)
               for name, out in (("first", first), ("second", second))]
    return more_accurate(figures[0], figures[1]), more_accurate(figures[1], figures[0])


def run(trials: int, seed: int) -> list[dict[str, Any]]:
    rows_out = []
    for model in MODELS:
        for rows, elements in SIZES:
            for worse in WORSE:
                rng = np.random.default_rng([seed, rows, elements, int(worse * 1000), list(MODELS).index(model)])
                first = second = 0
                for _ in range(trials):
                    a, b = trial(rng, model, rows, elements, worse)
                    first += a
                    second += b
                row: dict[str, Any] = {"model": model, "rows": rows, "elements": elements, "worse": worse,
                                       "trials": trials, "first_ordered": first / trials,
                                       "second_ordered": second / trials}
                if worse == 0:
                    row["ordered"] = (first + second) / trials
                    row["ok"] = row["ordered"] <= GOAL
                elif worse < 0.1:
                    row["wrong"] = second / trials
                    row["ok"] = row["wrong"] <= GOAL
                else:
                    row["found"] = first / trials
                    row["ok"] = True  # power is stated, not a goal
                rows_out.append(row)
                print(f"{model:9s} {rows:3d}x{elements:<5d} worse {worse:5.3f}: " + (
                    f"ordered {row['ordered']:.3f}" if "ordered" in row else f"wrong {row['wrong']:.3f}"
                    if "wrong" in row else f"found {row['found']:.3f}") + ("" if row["ok"] else "  FAIL"),
                    flush=True)
    return rows_out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rule", choices=("today", "before"), default="today",
                        help="today's code, or the rules before it (the max's spread the gap between the two largest "
                        "rows, each figure at 95%%, the max judged alone)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.rule == "before":
        from trtflow_stages.accuracy import resolution
        from trtflow_stages.decision import tie_breakers

        resolution.max_spread = _gap_rule  # type: ignore[assignment]
        tie_breakers.widening = lambda figures: 1.0  # type: ignore[assignment]
        tie_breakers._max_with_the_mean = lambda comparison, found: comparison  # type: ignore[assignment]
    started = time.perf_counter()
    rows = run(args.trials, args.seed)
    failed = [r for r in rows if not r["ok"]]
    print(f"{len(rows)} rows, {args.trials} trials each, rule {args.rule}: {len(failed)} goal(s) failed "
          f"({time.perf_counter() - started:.0f} s)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rule": args.rule, "trials": args.trials, "seed": args.seed, "rows": rows},
                                       indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
