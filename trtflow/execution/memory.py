"""How much host memory a node will need: the scheduler admits nodes whose needs fit together.

The need is the larger of an estimate and what the node reached the last time it ran (its measured peak, from
the journal). The estimate is, in order: the recipe's ``resources: {memory_mb: ...}``, the stage's own
``memory(params, input_sizes)``, or a default of a process plus a few copies of its inputs.
"""

from __future__ import annotations

from collections.abc import Mapping

from trtflow.execution.scheduler import default_memory_need
from trtflow.graph import Graph
from trtflow.plan import node_resources
from trtflow.recipe.expand import ConcreteNode


def memory_need(graph: Graph, node: ConcreteNode, input_sizes: Mapping[str, int], measured: int | None) -> int:
    """Bytes ``node`` may use at its peak; ``input_sizes``: bytes per input slot; ``measured``: its last peak."""
    stage = graph.stages[node.stage]
    declared = node_resources(graph, node).memory_mb
    if declared is not None:
        estimate = declared << 20
    elif stage.memory is not None:
        try:
            estimate = int(stage.memory(node.params_model, dict(input_sizes)))
        except Exception:  # an estimate must never stop a run
            estimate = default_memory_need(sum(input_sizes.values()))
    else:
        estimate = default_memory_need(sum(input_sizes.values()))
    return max(estimate, int(measured or 0))
