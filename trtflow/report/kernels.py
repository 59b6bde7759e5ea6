"""The top CUDA kernels of every benchmarked candidate, side by side (from each summary's ``top_kernels``,
read through `trtflow.summaries.BenchmarkSummary`).

A benchmark node run with ``profile_kernels`` summarises the kernels of its timed work like Nsight Systems'
kernel summary; its node summary keeps the first few (name, share of kernel time, average duration, launches per
iteration). This module lines them up by rank, one column per node, so precisions can be compared at a glance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trtflow.storage.records import benchmark_of
from trtflow.summaries import BenchmarkSummary, KernelRow

#: Longest kernel name shown in a cell (CUTLASS and cuBLAS names run to hundreds of characters).
NAME_LIMIT = 72


@dataclass
class KernelTable:
    columns: list[str]  # node names
    per_iteration_ms: list[float | None]  # kernel time per iteration of each column
    rows: list[list[str]]  # one per rank, one cell per column


def _cell(kernel: KernelRow) -> str:
    name = str(kernel.get("name", "?"))
    if len(name) > NAME_LIMIT:
        name = name[:NAME_LIMIT - 3] + "..."
    percent, average = kernel.get("percent"), kernel.get("average_us")
    count = kernel.get("per_iteration")
    parts = [f"{percent:.1f}%" if isinstance(percent, (int, float)) else "",
             f"{average:.4g} us" if isinstance(average, (int, float)) else "",
             f"x{count:g}/iter" if isinstance(count, (int, float)) else ""]
    return f"{name} ({', '.join(p for p in parts if p)})"


def kernel_table(nodes: Sequence[Mapping[str, Any]]) -> KernelTable | None:
    """The nodes whose summary has ``top_kernels``, ranked side by side; None when none has."""
    chosen: list[tuple[str, BenchmarkSummary]] = [
        (str(n["node"]), summary) for n in nodes
        if (summary := benchmark_of(n.get("summary"))) is not None and summary.get("top_kernels")]
    if not chosen:
        return None
    tops = [summary.get("top_kernels") or [] for _, summary in chosen]
    depth = max(len(top) for top in tops)
    rows = [[_cell(top[rank]) if rank < len(top) else "" for top in tops] for rank in range(depth)]
    return KernelTable(columns=[node for node, _ in chosen],
                       per_iteration_ms=[summary.get("kernel_time_per_iteration_ms") for _, summary in chosen],
                       rows=rows)


def markdown(table: KernelTable | None) -> str:
    if table is None:
        return ""
    head = "| rank | " + " | ".join(table.columns) + " |"
    rule = "|---:|" + "---|" * len(table.columns)
    total = "| kernel time / iteration | " + " | ".join(
        f"{value:.4g} ms" if isinstance(value, (int, float)) else "-" for value in table.per_iteration_ms) + " |"
    body = [f"| {rank} | " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"
            for rank, row in enumerate(table.rows, 1)]
    return "\n".join(["## Top CUDA kernels", "", head, rule, total, *body, ""]) + "\n"


def context(data: Mapping[str, Any]) -> dict[str, Any]:
    """What the report templates need: the table, or None."""
    return {"kernels": kernel_table(data.get("nodes", [])), "kernels_markdown": markdown}
