"""What an accuracy figure can tell apart: its numerical resolution and its spread over the validation's rows.

Two candidates' figures (cosine similarity, mean and max absolute error against the same reference) differ in a way
that means something only when the difference is beyond

- the figure's **numerical resolution**: what rounding alone moves it by. Polygraphy computes the cosine similarity
  in float32 for float32 and float16 outputs (float64 for float64): its dot product and two norms, each a pairwise
  sum of ``n`` terms, carry a relative rounding error up to about ``eps x (log2 n + 1)`` (Higham, *Accuracy and
  Stability of Numerical Algorithms*, 4.2), so two cosines that differ in float32's seventh or eighth digit are the
  same. An absolute error smaller than the outputs' own rounding (``eps`` of the coarser output dtype times the
  reference's mean or largest magnitude) is not an error the candidate made; and
- the figure's **spread over the rows** (the validation's samples): the half-width of its 95% interval, from the
  per-row figures (Student's t over the rows for the cosine and the mean error; for the largest error, how far the
  maximum of the rows falls when the rows are resampled: the 2.5% quantile of the bootstrap distribution of the
  maximum, computed exactly (`max_spread`), not the gap between the two largest rows, which orders statistically
  identical candidates "by accuracy" 28% of the time: ``bench/accuracy_order.py``).

`figure_uncertainty` measures both for one output; `decision.tie_breakers` compares candidates with them.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

#: The figures an uncertainty is recorded for, in the order a reason lists them.
FIGURES = ("cosine_similarity", "mean_abs_error", "max_abs_error")

FLOAT32_EPS = 2.0 ** -23
FLOAT64_EPS = 2.0 ** -52


def _eps(dtype: Any) -> float:
    import numpy as np

    kind = np.dtype(dtype)
    return float(np.finfo(kind).eps) if kind.kind == "f" else 0.0


def cosine_resolution(elements: int, eps: float = FLOAT32_EPS) -> float:
    """How much rounding alone can move a cosine similarity computed over ``elements`` values with machine epsilon
    ``eps``: the dot product and both norms' pairwise sums (``log2 n`` levels each), the products, the division and
    the square roots."""
    return eps * (math.ceil(math.log2(max(elements, 2))) + 4)


def half_width(values: Any) -> float:
    """Half-width of the 95% Student-t interval of the mean of ``values`` (0 for fewer than two)."""
    import numpy as np
    from scipy import stats

    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size < 2:
        return 0.0
    spread = float(np.std(values, ddof=1))
    return float(stats.t.ppf(0.975, values.size - 1)) * spread / math.sqrt(values.size)


def max_spread(maxima: Any) -> float:
    """How far the largest of ``maxima`` (the per-row maxima, any order) can fall within a 95% interval when the rows
    are resampled with replacement: the sample maximum less the 2.5% quantile of the bootstrap distribution of the
    maximum. That distribution is known exactly, no resampling drawn: the maximum of ``n`` rows drawn from the
    sorted ``x(1) <= ... <= x(n)`` is at most ``x(j)`` with probability ``(j / n) ** n``; so the quantile is the
    ``x(j)`` of the smallest ``j`` with ``(j / n) ** n >= 0.025`` (the 4th largest row for 16 rows or more, the
    smallest of 2). 0 for fewer than two rows."""
    import numpy as np

    values = np.sort(np.asarray(maxima, dtype=np.float64))
    n = int(values.size)
    if n < 2:
        return 0.0
    j = next(j for j in range(1, n + 1) if (j / n) ** n >= 0.025)
    return float(values[-1] - values[j - 1])


def figure_uncertainty(reference: Any, candidate: Any) -> dict[str, Any]:
    """For one output (``reference`` and ``candidate`` arrays, rows along axis 0): the number of rows, and per
    figure its numerical resolution and its 95% spread over the rows."""
    import numpy as np

    ref, cand = np.asarray(reference), np.asarray(candidate)
    computed = np.float64 if np.float64 in (ref.dtype, cand.dtype) else np.float32
    stored_eps = max(_eps(ref.dtype), _eps(cand.dtype))
    ref64, cand64 = ref.astype(np.float64), cand.astype(np.float64)
    finite = np.isfinite(ref64) & np.isfinite(cand64)
    magnitude = np.abs(np.where(finite, ref64, 0.0))
    resolution = {
        "cosine_similarity": cosine_resolution(int(ref.size), float(np.finfo(computed).eps)),
        "mean_abs_error": stored_eps * float(magnitude.mean()) if magnitude.size else 0.0,
        "max_abs_error": stored_eps * float(magnitude.max()) if magnitude.size else 0.0,
    }
    rows = int(ref.shape[0]) if ref.ndim >= 1 and ref.shape[0] > 0 else 1
    spread = dict.fromkeys(FIGURES, 0.0)
    if rows >= 2 and ref.size:
        r = ref64.reshape(rows, -1)
        c = cand64.reshape(rows, -1)
        ok = finite.reshape(rows, -1)
        error = np.where(ok, np.abs(c - r), np.nan)
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a row with no finite element: its figure is nan
            means = np.nanmean(error, axis=1)
            maxima = np.sort(np.nan_to_num(np.nanmax(error, axis=1), nan=0.0))
            rz, cz = np.where(ok, r, 0.0), np.where(ok, c, 0.0)
            cosines = (rz * cz).sum(axis=1) / (np.linalg.norm(rz, axis=1) * np.linalg.norm(cz, axis=1))
        spread = {"cosine_similarity": half_width(cosines), "mean_abs_error": half_width(means),
                  "max_abs_error": max_spread(maxima)}
    return {"rows": rows, "resolution": resolution, "spread": spread}
