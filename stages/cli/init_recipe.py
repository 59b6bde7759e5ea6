"""The recipe text `trtflow init` writes: each chain of nodes (export, candidates, validation, benchmarks, selection,
engine, Triton) with its profiles, and the header that says where its data comes from."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .init_inputs import ModelInput, Range


def _shape(spec: ModelInput, ranges: dict[str, Range], pick: str) -> list[int]:
    return [d if isinstance(d, int) else getattr(ranges[d], pick) for d in spec.dims]


def flow(value: Any) -> str:
    """A YAML flow-style value (one line)."""
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 20, sort_keys=False).strip()
    return text[:-4].rstrip() if text.endswith("\n...") else text


def schema_reference(recipe_dir: Path) -> tuple[str, Path | None]:
    """The modeline's schema path: a shipped schema/recipe.schema.json above the recipe, else one to write."""
    for folder in (recipe_dir, *recipe_dir.parents):
        shipped = folder / "schema" / "recipe.schema.json"
        if shipped.is_file():
            return os.path.relpath(shipped, recipe_dir), None
        if (folder / ".git").exists() or (folder / "pyproject.toml").exists():
            break
    return "recipe.schema.json", recipe_dir / "recipe.schema.json"


@dataclass
class Scaffold:
    """One chain of the recipe: export, the fp32/fp16/int8 candidates, validation, benchmarks, selection, engine
    and Triton repository. An encoder-decoder model gets two (``part``: encoder, decoder), their nodes and profile
    named after the part."""

    name: str
    model_ref: str  # what the export node's `model` param says
    inputs: list[ModelInput]
    ranges: dict[str, Range]
    data_ref: str | None  # a recipe path of real data, or None for random data
    outputs: list[str] | None  # output names given with --output-name (None: the model's own)
    source: str  # what `trtflow init` was given, for the header
    write_inputs: bool = False  # the export node needs `inputs:` (a factory or a TorchScript archive)
    model_format: str = "onnx"
    task: str | None = None  # a Hugging Face folder's task
    part: str | None = None  # an encoder-decoder's part (encoder, decoder)
    trust_code: bool = False  # --trust-code: the export node reads the model file unconfined

    @property
    def dynamic(self) -> bool:
        return bool(self.ranges)

    @property
    def batch(self) -> Range | None:
        names = {spec.dims[0] for spec in self.inputs if spec.dims and isinstance(spec.dims[0], str)}
        return self.ranges[names.pop()] if len(names) == 1 else None

    @property
    def suffix(self) -> str:
        return f"-{self.part}" if self.part else ""

    @property
    def profile(self) -> str:
        return self.part or "default"

    def data_source(self) -> dict[str, Any]:
        if self.data_ref is not None:
            return {"path": self.data_ref}
        one = {spec.name: [1, *_shape(spec, self.ranges, "opt")[1:]] if self.batch else
               _shape(spec, self.ranges, "opt") for spec in self.inputs}
        random: dict[str, Any] = {"seed": 0, "num_samples": 32, "shapes": one}
        ranges = {spec.name: list(spec.value_range) for spec in self.inputs if spec.value_range}
        if ranges:
            random["ranges"] = ranges
        return {"random": random}

    def profile_lines(self) -> list[str]:
        if not self.dynamic:
            return []
        shapes = {spec.name: {"min": _shape(spec, self.ranges, "min"), "opt": _shape(spec, self.ranges, "opt"),
                              "max": _shape(spec, self.ranges, "max")}
                  for spec in self.inputs if any(isinstance(d, str) for d in spec.dims)}
        return [f"  {self.profile}: {flow(shapes)}"]

    def node_lines(self) -> list[str]:
        batch = self.batch
        opt_batch = batch.opt if batch else None
        x = self.suffix
        anchor = "data" + (f"_{self.part}" if self.part else "")
        opt_shapes = {spec.name: _shape(spec, self.ranges, "opt") for spec in self.inputs}
        data = flow(self.data_source())
        candidates = f"[simplify{x}, convert{x}, quantize{x}]"
        lines = [f"  - name: export{x}" + (f"                # the {self.part}" if self.part else ""),
                 "    stage: export", "    params:", f"      model: {flow(self.model_ref)}"]
        if self.task:
            lines.append(f"      task: {flow(self.task)}")
        if self.part:
            lines.append(f"      part: {self.part}")
        if self.trust_code:
            lines.append("      trust_code: true   # --trust-code: the model file's own code runs unconfined")
        if self.write_inputs:
            export_inputs = {}
            for spec in self.inputs:
                entry: dict[str, Any] = {"shape": _shape(spec, self.ranges, "opt"), "dtype": spec.dtype}
                axes = {axis: dim for axis, dim in enumerate(spec.dims) if isinstance(dim, str)}
                if axes:
                    entry["dynamic_axes"] = axes
                export_inputs[spec.name] = entry
            lines.append(f"      inputs: {flow(export_inputs)}")
        if self.outputs:
            lines.append(f"      outputs: {flow(self.outputs)}")
        if self.dynamic:
            lines.append(f"      profiles: [{self.profile}]   # checked at the profile's min and max")
        lines += [
            "",
            f"  - name: simplify{x}                # the fp32 candidate",
            "    stage: simplify",
            *([f"    inputs: {{model: export{x}}}"] if x else []),
            f"    params: {{input_shapes: {flow(opt_shapes)}}}",
            "",
            f"  - name: convert{x}                 # fp16 candidate (ModelOpt AutoCast; fp32 where values overflow "
            "fp16)",
            "    stage: convert",
            f"    inputs: {{model: simplify{x}}}",
            f"    params: {{precision: fp16, calibration_data: &{anchor} {data}}}",
            "",
            f"  - name: quantize{x}                # int8 candidate (ModelOpt post-training quantization)",
            "    stage: quantize",
            f"    inputs: {{model: simplify{x}}}",
            f"    params: {{mode: int8, calibration_data: *{anchor}}}",
            "",
            f"  - name: validate{x}                # every candidate against the original model, with one accuracy "
            "budget",
            "    stage: validate",
            f"    matrix: {{candidate: {candidates}}}",
            f'    inputs: {{reference: export{x}, candidate: "${{{{ matrix.candidate }}}}"}}',
            "    params:",
            f"      data: *{anchor}",
        ]
        if opt_batch:
            lines.append(f"      batch_size: {opt_batch}")
        lines += [
            "      tolerances: {check_error_stat: mean, atol: 0.05, rtol: 0.05, min_cosine_similarity: 0.99}",
            "",
            f"  - name: benchmark{x}               # on ONNX Runtime; on a GPU, benchmark engines (pipelines/cnn.yaml)",
            "    stage: benchmark",
            f"    matrix: {{candidate: {candidates}}}",
            '    inputs: {model: "${{ matrix.candidate }}"}',
            "    params:",
            "      backend: onnxruntime",
            "      onnxruntime: {intra_op_threads: 1}   # one core: timings that hold on a shared machine (CI runners)",
        ]
        if any(spec.value_range for spec in self.inputs) and self.data_ref is None:
            lines.append(f"      data: *{anchor}               # for the value ranges (token ids below the vocabulary)")
        if self.dynamic:
            lines.append(f"      profile: {self.profile}")
            if batch:
                sizes = sorted({batch.min, batch.opt, batch.max})
                lines.append(f"      batch_sizes: {flow(sizes)}")
        else:
            lines.append(f"      shapes: {flow(opt_shapes)}")
        lines += [
            "      min_duration_s: 1.0",
            "",
            f"  - name: select{x}                  # the fastest candidate that passes validation; selection.json "
            "says why",
            "    stage: select",
            f"    inputs: {{candidates: {candidates}, validations: validate{x}, benchmarks: benchmark{x}}}",
            "    params:",
            "      objective: " + flow({"goal": "min_latency", "percentile": "p50", **(
                {"batch_size": opt_batch} if opt_batch else {})}),
            f"      baseline: simplify{x}",
            "      # the candidates not clearly beaten are timed again together (finalists); one within 5% of the",
            "      # fastest is a tie, and the most accurate tied one wins (tolerance_percent: a preference band)",
            "      tie_breakers: {tolerance_percent: 5, order: [accuracy, size]}",
            "",
            f"  - name: build{x}                   # a TensorRT engine of the selected model (TensorRT-RTX builds on "
            "CPUs)",
            "    stage: build",
            f"    inputs: {{model: select{x}}}",
            "    params: {backend: auto" + (f", profile: {self.profile}" if self.dynamic else "") + "}",
            "",
            f"  - name: triton{x}                  # a Triton model repository of the selected model",
            "    stage: triton",
            f"    inputs: {{model: select{x}}}",
            "    params: {" + (f"profile: {self.profile}, " if self.dynamic and batch else "")
            + ("max_batch_size: 0, " if not batch else "") + "instance_kind: gpu}",
        ]
        return lines


def render(chains: list[Scaffold], schema: str) -> str:
    """The recipe text: a header, the profiles of every chain, then each chain's nodes."""
    first = chains[0]
    lines = [f"# yaml-language-server: $schema={schema}",
             f"# Written by `trtflow init {first.source}` ({first.model_format}"
             + (f", task {first.task}" if first.task else "") + "): a starting point; edit it freely."]
    for chain in chains:
        lines.append(f"# {chain.part.capitalize() + ' inputs' if chain.part else 'Model inputs'}: "
                     + "; ".join(spec.describe() for spec in chain.inputs))
    if len(chains) > 1:
        lines.append(f"# An encoder-decoder model: the {' and the '.join(str(c.part) for c in chains)} are exported, "
                     "optimised and deployed each as its own chain (the decoder without a KV cache).")
    if first.data_ref is None:
        lines += [
            "#",
            "# WARNING: no --data was given, so calibration, validation and benchmarks use RANDOM inputs",
            "# (`random:` below). int8 calibration and accuracy figures on random data say little about real",
            "# inputs: replace every `random:` data source with real samples (`path: samples.npz`, one array per",
            "# input), or run `trtflow init ... --data samples.npz`.",
        ]
    lines += [f"name: {first.name}", f"description: {flow('fp32, fp16 and int8 candidates of ' + first.source)}"]
    profiles = [line for chain in chains for line in chain.profile_lines()]
    if profiles:
        lines += ["", "profiles:                      # proposed from the dynamic dimensions", *profiles]
    lines += ["", "nodes:"]
    for index, chain in enumerate(chains):
        if index:
            lines.append("")
        lines += chain.node_lines()
    return "\n".join(lines) + "\n"
