"""Pydantic models of a recipe file. Stage parameters are validated later, against each stage's Params."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

NODE_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]*$"
NAME_MAX_LENGTH = 128  # names become file names (refs, logs, build/<recipe>/<node>/)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ShapeRange(BaseModel):
    """Smallest, optimal and largest shape of one input in an optimization profile."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min: list[int] = Field(description="Smallest shape the engine must accept, e.g. [1, 3, 224, 224].")
    opt: list[int] = Field(description="Shape TensorRT optimizes for: the most common one at run time.")
    max: list[int] = Field(description="Largest shape the engine must accept.")

    @model_validator(mode="after")
    def _consistent(self) -> ShapeRange:
        ranks = {len(self.min), len(self.opt), len(self.max)}
        if len(ranks) != 1:
            raise ValueError(
                f"min, opt and max must have the same rank, got min={self.min} (rank {len(self.min)}), "
                f"opt={self.opt} (rank {len(self.opt)}), max={self.max} (rank {len(self.max)})")
        for axis, (lo, mid, hi) in enumerate(zip(self.min, self.opt, self.max, strict=True)):
            if lo < 0:
                raise ValueError(f"dimension {axis} of min is negative ({lo}); profile shapes are concrete sizes")
            if not lo <= mid <= hi:
                raise ValueError(
                    f"need min <= opt <= max in every dimension, but dimension {axis} has min={lo}, opt={mid}, "
                    f"max={hi} (min={self.min}, opt={self.opt}, max={self.max})")
        return self


class ProfileSpec(BaseModel):
    """A named optimization profile: min/opt/max shapes for the model's inputs (as stages receive it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("profile", description="Profile name (from the recipe's profiles: section).")
    shapes: dict[str, ShapeRange] = Field(description="Shape ranges by model input name.")

    @model_validator(mode="after")
    def _not_empty(self) -> ProfileSpec:
        if not self.shapes:
            raise ValueError(f"profile {self.name!r} gives no input shapes")
        return self


class ResourcesSpec(Strict):
    """Overrides of what the stage declares it needs while it runs (the scheduler starts it only when free)."""

    cpu: float | None = Field(default=None, gt=0, description="CPU slots (of `-j`) the node keeps busy.")
    gpu: int | None = Field(default=None, ge=0, description="GPUs the node needs.")
    exclusive: bool | None = Field(
        default=None, description="Run alone: nothing else starts beside it (benchmarks are exclusive by default; "
        "false lets other nodes run beside one).")
    memory_mb: int | None = Field(default=None, gt=0, description="Peak host memory in MiB (overrides the stage's "
                                  "estimate and the measured peak).")
    compute_capability: str | None = Field(
        default=None, pattern=r"^(>=)?(sm)?\d+(\.\d+)?$",
        description="Run only on GPUs of this compute capability, e.g. '9.0', 'sm90' or '>=8.0'; results are keyed "
        "by the GPU class they were made on.")
    gpu_name: str | None = Field(default=None, description="Run only on GPUs whose name contains this, e.g. 'H100'.")


class NodeSpec(Strict):
    """One node of the pipeline: a stage with its parameters and where its inputs come from."""

    name: str = Field(
        pattern=NODE_NAME_PATTERN, max_length=NAME_MAX_LENGTH,
        description="Unique node name (letters, digits, '_', '-', '.'). Matrix variants get suffixes.",
    )
    stage: str = Field(description="Stage to run: export, simplify, quantize, convert, build, validate, "
                       "benchmark, or any stage a plugin registers.")
    description: str | None = Field(default=None, description="Free text shown by `trtflow show`.")
    params: dict[str, Any] = Field(default_factory=dict, description="The stage's parameters (see its schema).")
    inputs: dict[str, str | list[str]] = Field(
        default_factory=dict,
        description="Input slot -> reference 'node' or 'node.output'. An omitted required slot takes the "
        "nearest earlier node that produces the right kind of artifact.",
    )
    matrix: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="Fan the node out over every combination of these values. A key that is a stage "
        "parameter sets it; every key is available as ${{ matrix.KEY }} in params and inputs.",
    )
    timeout: float | None = Field(default=None, gt=0, description="Seconds before the node is killed as hung.")
    enabled: bool = Field(default=True, description="Set to false to leave the node out of the pipeline.")
    resources: ResourcesSpec | None = Field(default=None, description="Override the stage's resource needs.")


class Recipe(Strict):
    """A trtflow recipe: named shape profiles, per-stage defaults and the nodes of the pipeline."""

    version: Literal[1] = Field(default=1, description="Recipe format version.")
    name: str = Field(pattern=NODE_NAME_PATTERN, max_length=NAME_MAX_LENGTH,
                      description="Recipe name; outputs go to build/<name>/.")
    description: str | None = Field(default=None, description="What this pipeline produces.")
    extends: str | None = Field(
        default=None, description="Path of a base recipe (relative to this file) whose settings this "
        "one extends; nodes with the same name are merged, others appended."
    )
    profiles: dict[str, dict[str, ShapeRange]] = Field(
        default_factory=dict,
        description="Named optimization profiles: profile name -> input name -> {min, opt, max}. A stage "
        "parameter 'profile' (a name) or 'profiles' (a list of names) refers to them.",
    )
    defaults: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Default parameters per stage name, e.g. {build: {backend: tensorrt-rtx}}.",
    )
    require_all_candidates: bool = Field(
        default=False,
        description="Fail the run (exit 1) when any candidate fails a quality gate, even one that select did not "
        "choose. By default a candidate that fails its gate and is not chosen, and that reaches nothing but its own "
        "validate/benchmark nodes and selects that chose another candidate, is an outcome of the decision: the run "
        "lists it as rejected, with its node and reason, and exits 0.",
    )
    nodes: list[NodeSpec] = Field(min_length=1, description="The pipeline's nodes, in a sensible order.")


RECIPE_TOP_KEYS = tuple(Recipe.model_fields)
NODE_KEYS = tuple(NodeSpec.model_fields)
