"""The tie-breakers' keys: how tied candidates sort on accuracy, size, latency or throughput."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from trtflow.digits import finite


def tie_key(row: Mapping[str, Any], criterion: str) -> float:
    """Sort key of a tie-breaker (smaller sorts first); a missing figure sorts last."""
    if criterion == "accuracy":
        value = (row.get("validation") or {}).get("cosine_similarity")
        return -value if finite(value) else math.inf
    if criterion == "size":
        return float(row["size_bytes"])
    point = row.get("operating_point") or {}
    if criterion == "latency":
        value = point.get("latency_ms")
        return value if finite(value) else math.inf
    value = point.get("throughput_qps")
    return -value if finite(value) else math.inf


CRITERION_TEXT = {"accuracy": "accuracy (cosine similarity)", "size": "size", "latency": "latency",
                  "throughput": "throughput"}
