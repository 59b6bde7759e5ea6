"""Put a node's inputs where its stage will read them: hard links into its scratch space (local executors), or,
for executors whose workers fetch their inputs themselves (Ray), the objects each slot needs.

Both read only the node's `Upstream` view (its producers' outputs, taken when the node was handed out) and the
store, so they run on the node's thread without touching anything another thread writes.
"""

from __future__ import annotations

from typing import Any

from trtflow.errors import TrtflowError
from trtflow.execution.ledger import Upstream
from trtflow.graph import Graph
from trtflow.recipe.expand import ConcreteNode
from trtflow.storage.confined.names import Refused
from trtflow.storage.confined.tree import Tree
from trtflow.storage.store import Store


def link_inputs(graph: Graph, store: Store, node: ConcreteNode, upstream: Upstream,
                scratch: Tree) -> dict[str, str | list[str]]:
    """Hard-link each input into ``scratch/in/<slot>/``, with the source node's other outputs beside it.

    Siblings travel along so that companion files stay together: an ONNX model's external weights
    (``model.onnx_data``) or an engine's provenance manifest (``engine.json``). Objects are immutable and
    checked against their digest before use (re-hashed in full, not trusted on their size, mtime and inode: a
    stage never reads damaged bytes). A many-slot gets a list: each artifact in ``scratch/in/<slot>/<producer>/``.
    """
    inputs: dict[str, str | list[str]] = {}
    specs = graph.stages[node.stage].inputs
    for slot, refs in node.upstream.items():
        if specs[slot].many:
            inputs[slot] = [_link_one(graph, store, upstream, src, out, scratch, ("in", slot, src))
                            for src, out in refs]
        else:
            inputs[slot] = _link_one(graph, store, upstream, *refs[0], scratch, ("in", slot))
    return inputs


def _link_one(graph: Graph, store: Store, upstream: Upstream, src_node: str, out_name: str, scratch: Tree,
              folder: tuple[str, ...]) -> str:
    stage = graph.stages[graph.nodes[src_node].stage]
    produced = upstream.outputs(src_node)
    scratch.mkdir(folder)
    for name, out in stage.outputs.items():
        if name not in produced:
            continue
        digest, size = produced[name]
        source = store.object_path(digest)
        if not store.object_intact(digest, size):
            raise TrtflowError(
                f"the stored output {src_node}.{name} ({source}) is missing or changed after it was "
                "committed; it is not used",
                hint="run `trtflow verify --fix`, then run again: the damaged node is rebuilt")
        target = (*folder, *out.filename.split("/"))
        try:
            store.tree.link_into(store.object_rel(digest), scratch, target)
        except Refused:
            raise
        except OSError:  # a file system without hard links
            with store.open_object(digest) as f:
                scratch.copy_in(target, f, durable=False)
    return str(scratch.shown((*folder, *stage.outputs[out_name].filename.split("/"))))


def remote_inputs(graph: Graph, store: Store, node: ConcreteNode, upstream: Upstream
                  ) -> tuple[dict[str, str | list[str]], dict[str, dict[str, dict[str, Any]]]]:
    """For workers that fetch their inputs (from the executor's transfer area): the file name of each slot's
    input, and the objects each input place needs (``<slot>``, or ``<slot>/<producer>`` in a many-slot). The
    caller makes sure the producers' objects are in the transfer area."""
    inputs: dict[str, str | list[str]] = {}
    objects: dict[str, dict[str, dict[str, Any]]] = {}
    specs = graph.stages[node.stage].inputs
    for slot, refs in node.upstream.items():
        names = []
        for src_node, out_name in refs:
            place = f"{slot}/{src_node}" if specs[slot].many else slot
            manifest = store.read_manifest(upstream.key(src_node)) or {}
            objects[place] = dict(manifest.get("outputs", {}))
            if out_name not in objects[place]:
                raise TrtflowError(f"the stored result of {src_node} has no output {out_name!r}",
                                   hint="run `trtflow verify --fix`, then run again: the damaged node is rebuilt")
            filename = objects[place][out_name]["filename"]
            names.append(f"{src_node}/{filename}" if specs[slot].many else filename)
        inputs[slot] = names if specs[slot].many else names[0]
    return inputs, objects
