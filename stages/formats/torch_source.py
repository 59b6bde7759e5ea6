"""source.json: which PyTorch model an export came from, for the stages that need the PyTorch model itself.

The export stage writes it beside the ONNX model it exports from a ``python:`` factory: the factory reference as
the recipe wrote it (relative to the recipe), its arguments, the checkpoint, the inputs (names, sample shapes,
dtypes, dynamic axes, value ranges), the output names and the opset, with the content digests of the factory's code
(its file and the project files it imports) and of the checkpoint. A node that takes it as an input (quantize's
PyTorch route: nvfp4, mxfp8) is keyed by its digest, so it re-runs when the factory's code or the weights change.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


class SampleInput(Protocol):
    """What the export libraries read of one ``inputs:`` entry of an export node (the export stage's ``InputDef``)."""

    @property
    def shape(self) -> list[int]: ...

    @property
    def dtype(self) -> str: ...

    @property
    def dynamic_axes(self) -> Mapping[int, str]: ...

    @property
    def low(self) -> float: ...

    @property
    def high(self) -> float: ...


class TorchSourceParams(Protocol):
    """What source.json records of an export node's params (the export stage's ``Params``)."""

    @property
    def model(self) -> str: ...

    @property
    def factory_args(self) -> Mapping[str, Any]: ...

    @property
    def checkpoint(self) -> str | None: ...

    @property
    def inputs(self) -> Mapping[str, SampleInput]: ...

    @property
    def outputs(self) -> list[str] | None: ...

    @property
    def opset(self) -> int: ...


#: The artifact kind of source.json.
TORCH_SOURCE = "torch_source"
FILENAME = "source.json"


@dataclass(frozen=True)
class TorchSource:
    model: str
    factory_args: dict[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    opset: int = 17
    code_digest: str | None = None
    checkpoint_digest: str | None = None

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2, sort_keys=True) + "\n"

    @property
    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        return {name: {int(axis): dim for axis, dim in spec.get("dynamic_axes", {}).items()}
                for name, spec in self.inputs.items() if spec.get("dynamic_axes")}


def read_source(path: Path) -> TorchSource:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return TorchSource(**{key: data[key] for key in TorchSource.__dataclass_fields__ if key in data})


def code_digest(spec: str, resolve: Callable[[str], Path], project_root: Path) -> str | None:
    """Digest of the code a ``python:`` factory runs (its file or module and the project files it imports)."""
    from trtflow.callables import module_origin, split_spec
    from trtflow.codehash import callable_code

    target, _ = split_spec(spec)
    body = target[len("python:"):]
    if body.endswith(".py") or "/" in body or "\\" in body:
        return callable_code(resolve(body), project_root).digest
    origin = module_origin(body)
    return callable_code(Path(origin), project_root).digest if origin else None


def source_of(params: TorchSourceParams, resolve: Callable[[str], Path], project_root: Path) -> TorchSource:
    """The source.json of an export node's params (a ``python:`` model)."""
    from trtflow.fingerprint import hash_file_content

    inputs = {name: {"shape": list(spec.shape), "dtype": spec.dtype,
                     "dynamic_axes": {str(axis): dim for axis, dim in spec.dynamic_axes.items()},
                     "low": spec.low, "high": spec.high} for name, spec in params.inputs.items()}
    return TorchSource(
        model=params.model, factory_args=dict(params.factory_args), checkpoint=params.checkpoint, inputs=inputs,
        outputs=list(params.outputs or []), opset=params.opset,
        code_digest=code_digest(params.model, resolve, project_root),
        checkpoint_digest=hash_file_content(resolve(params.checkpoint)) if params.checkpoint else None)


def write_source(ctx: Any, params: TorchSourceParams) -> None:
    """The export node's source.json (its ``source`` output)."""
    from trtflow.fsutil import project_root

    source = source_of(params, ctx.resolve, project_root(ctx.recipe_dir) or ctx.recipe_dir)
    ctx.output("source").write_text(source.to_json(), encoding="utf-8")


def build_module(source: TorchSource, load_callable: Callable[[str, str], Any],
                 resolve: Callable[[str], Path] | None = None, weights: bool = True) -> Any:
    """The PyTorch model of ``source``: its factory called with its arguments, and (``weights``) its checkpoint
    loaded with ``torch.load(weights_only=True)``, in eval mode."""
    import torch

    from trtflow.stage import StageFailed

    factory = load_callable(source.model, "model factory")
    model = factory(**source.factory_args)
    if not isinstance(model, torch.nn.Module):
        raise StageFailed(f"the model factory {source.model!r} returned {type(model).__name__}, not a torch.nn.Module")
    if weights and source.checkpoint and resolve is not None:
        state = torch.load(resolve(source.checkpoint), map_location="cpu", weights_only=True)
        if isinstance(state, Mapping) and isinstance(state.get("state_dict"), Mapping):
            state = state["state_dict"]
        model.load_state_dict(state)
    return model.eval()
