"""The top CUDA kernels of every benchmarked candidate, side by side (from each summary's ``top_kernels``).

A benchmark node run with ``profile_kernels`` summarises the kernels of its timed work like Nsight Systems'
kernel summary; its node summary keeps the first few (name, share of kernel time, average duration, launches per
iteration). This module lines them up by rank, one column per node, so precisions can be compared at a glance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Longest kernel name shown in a cell (CUTLASS and cuBLAS names run to hundreds of characters).
NAME_LIMIT = 72


@dataclass
class KernelTable:
    columns: list[str]  # node names
    per_iteration_ms: list[float | None]  # kernel time per iteration of each column
    rows: list[list[str]]  # one per rank, one cell per column


def _cell(kernel: Mapping[str, Any]) -> str:
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
    chosen = [n for n in nodes if isinstance(n.get("summary"), Mapping) and n["summary"].get("top_kernels")]
    if not chosen:
        return None
    depth = max(len(n["summary"]["top_kernels"]) for n in chosen)
    rows = [[_cell(n["summary"]["top_kernels"][rank]) if rank < len(n["summary"]["top_kernels"]) else ""
             for n in chosen] for rank in range(depth)]
    return KernelTable(columns=[str(n["node"]) for n in chosen],
                       per_iteration_ms=[n["summary"].get("kernel_time_per_iteration_ms") for n in chosen],
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
