"""`trtflow init MODEL`: write a recipe for a model, from its inputs to a selection and its deployment.

The recipe runs as written: the model's inputs (names, dtypes, dynamic dimensions) are read from the ONNX file,
or given with ``--input`` for a PyTorch factory; a profile is proposed from the dynamic dimensions (batch from
``--batch``, others from ``--dim``); fp32, fp16 and int8 candidates are validated against the model and
benchmarked on ONNX Runtime, the best is selected, built into an engine and exported for Triton. Without
``--data`` the data is generated at random, which the recipe and the command say loudly.

Registered as a `trtflow` subcommand through the ``trtflow.commands`` entry-point group; heavy imports (onnx)
happen only when the command runs.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from trtflow.errors import RecipeError, TrtflowError, UsageError  # not trtflow.stage: `trtflow --help` imports this

from .init_inputs import ModelInput, Range, dynamic_ranges, parse_input_option, read_onnx_inputs
from .init_recipe import Scaffold, flow, render, schema_reference

#: The tasks export knows (formats.huggingface.TASKS; a test keeps them equal): spelled out so that `trtflow --help`
#: does not import transformers' mappings.
TASK_NAMES = ("text2text-generation", "text2text-generation-with-past", "fill-mask", "text-classification",
              "token-classification",
              "question-answering", "text-generation", "text-generation-with-past", "image-classification",
              "object-detection",
              "semantic-segmentation", "image-segmentation", "universal-segmentation", "depth-estimation",
              "zero-shot-image-classification", "image-feature-extraction", "text-feature-extraction",
              "audio-classification", "automatic-speech-recognition", "automatic-speech-recognition-with-past",
              "feature-extraction")
NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _recipe_name(text: str) -> str:
    name = NAME_UNSAFE.sub("-", text).strip("-.") or "model"
    return name if re.match(r"^[A-Za-z_]", name) else f"m-{name}"


def _inside_project(path: Path, output: Path, what: str) -> None:
    """Refuse now what `trtflow run` would refuse later: a recipe reads files only inside its project, and only
    what `fsutil.input_path` (plan's and run's check of an input) lets through: no named pipe, no device, a folder
    without such entries or links out of the project."""
    from trtflow.fsutil import allowed_roots_for, input_path

    recipe_dir = output.absolute().parent
    target = path.resolve()
    roots = allowed_roots_for(recipe_dir)
    if any(target.is_relative_to(root) for root in roots):
        try:
            input_path(path.absolute(), recipe_dir, roots)
        except TrtflowError as exc:
            raise UsageError(f"{what}: {exc.message}", hint=exc.hint) from None
        return
    raise UsageError(
        f"{what} {path}" + (f" (a link to {target})" if target != path.absolute() else "")
        + f" is outside the project of {output} ({roots[0]}): a recipe may only read files inside its "
        "project (the nearest folder above the recipe holding a .git or a pyproject.toml; without one, the "
        "recipe's own folder)",
        hint=f"write the recipe beside the file or above it (e.g. -o {path.parent / output.name}), mark the "
             "folder holding both as the project (git init, or an empty pyproject.toml), or list the file's "
             "folder in TRTFLOW_ALLOWED_PATHS")


def scaffold(model: str, output: Path, data: Path | None, inputs: list[str], outputs: list[str] | None, batch: str,
             dims: list[str], name: str | None, task: str | None = None, trust_code: bool = False) -> list[Scaffold]:
    """The recipe's chains for ``model``: one, or an encoder-decoder's encoder and decoder."""
    recipe_dir = output.absolute().parent
    batch_range = Range.parse(batch, "--batch")
    dim_ranges: dict[str, Range] = {}
    for item in dims:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--dim {item!r}: expected NAME=MIN:OPT:MAX, e.g. seq=1:128:512")
        dim_ranges[key] = Range.parse(value, f"--dim {key}")
    data_ref = None
    if data is not None:
        if not data.exists():
            raise UsageError(f"--data {data} not found", hint="give a .npz/.npy file or a directory of them")
        _inside_project(data, output, "--data")
        data_ref = os.path.relpath(data.absolute(), recipe_dir)
    if model.startswith("python:"):
        from trtflow.callables import validate_spec

        if trust_code:
            raise UsageError("--trust-code is for model files that carry a program; a python: factory needs no such "
                             "word", hint="leave --trust-code out")

        try:
            validate_spec(model)
        except ValueError as exc:
            raise UsageError(f"{model!r}: {exc}") from None
        if not inputs:
            raise UsageError("a PyTorch factory declares no input shapes: give each forward() argument with "
                             "--input NAME:DIMS[:DTYPE]", hint="e.g. --input input:batch,3,224,224:float32 (a name "
                             "in DIMS is a dynamic dimension; axis 0 is the batch)")
        specs = [parse_input_option(text) for text in inputs]
        reference = model
        target = model[len("python:"):].rpartition(":")[0]
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                raise UsageError(f"{target} not found", hint="give the factory's file relative to this directory")
            _inside_project(path, output, "the factory's file")
            reference = "python:" + os.path.relpath(path.absolute(), recipe_dir) + ":" + model.rpartition(":")[2]
        default_name = Path(target).stem if target.endswith(".py") else target.rpartition(".")[2]
        ranges = dynamic_ranges(specs, batch_range, dim_ranges)
        return [Scaffold(_recipe_name(name or default_name), reference, specs, ranges, data_ref, outputs, model,
                         write_inputs=True, model_format="python")]
    path = Path(model)
    reference = os.path.relpath(path.absolute(), recipe_dir)
    recipe_name = _recipe_name(name or (path.stem if path.is_file() else path.absolute().name))
    chains = []
    for described in _saved_model_parts(model, inputs, output, task, batch_range, trust_code):
        proposed = {k: Range(*v) for k, v in described.ranges.items() if any(k in s.dims for s in described.inputs)}
        ranges = dynamic_ranges(described.inputs, batch_range, {**proposed, **dim_ranges}, partial=True)
        ranges = {k: v for k, v in ranges.items() if any(k in spec.dims for spec in described.inputs)}
        chains.append(Scaffold(recipe_name, reference, described.inputs, ranges, data_ref, outputs, model,
                               write_inputs=described.format == "torchscript", model_format=described.format,
                               task=described.task, part=described.part, trust_code=trust_code))
    unknown = sorted(set(dim_ranges) - {d for chain in chains for d in chain.ranges})
    if unknown:
        raise UsageError(f"--dim names no dynamic dimension of the model: {', '.join(unknown)}",
                         hint="dynamic dimensions: " + (", ".join(sorted({d for c in chains for d in c.ranges}))
                                                        or "none"))
    return chains


@dataclass(frozen=True)
class Described:
    """A graph of a saved model: its inputs, format, proposed ranges of non-batch dims, task and part."""

    inputs: list[ModelInput]
    format: str
    ranges: dict[str, tuple[int, int, int]]
    task: str | None = None
    part: str | None = None


def _saved_model_parts(model: str, inputs: list[str], output: Path, task: str | None,
                       batch: Range, trust_code: bool = False) -> list[Described]:
    """The graphs of a model file or folder (two for an encoder-decoder); --input only for TorchScript.

    A model whose reading runs its own code is read as export would (formats.trust): in a confined child, or
    unconfined with --trust-code, or refused."""
    from ..formats.detect import check_content, detect
    from ..formats.trust import RUNS_CODE, decide

    path = Path(model)
    if not path.exists():
        raise UsageError(f"model {model!r} not found", hint="give an .onnx, .pt, .pt2, .keras file, a Hugging Face "
                         "or SavedModel folder, or python:file.py:factory")
    try:
        fmt = detect(model, path)
        check_content(fmt, path, model)
    except TrtflowError as exc:  # what `trtflow run` reports as a recipe error (exit 2) at plan time
        raise UsageError(exc.message, hint=exc.hint) from None
    _inside_project(path, output, "the model")
    if trust_code and fmt.name not in RUNS_CODE:
        raise UsageError(f"--trust-code is for model files that carry a program ({', '.join(RUNS_CODE)}); a "
                         f"{fmt.label} needs no such word", hint="leave --trust-code out")
    # a model trtflow will not read (it runs code, and nothing confines it here) fails as export's node would
    permit = decide(fmt, path, model, trust_code, "give --trust-code")
    if task is not None and fmt.name != "huggingface":
        raise UsageError(f"--task is for Hugging Face model folders; {model} is a {fmt.label}")
    if fmt.name == "torchscript":
        if not inputs:
            raise UsageError("a TorchScript archive does not record its input shapes: give each forward() argument "
                             "with --input NAME:DIMS[:DTYPE]", hint=_torchscript_input_hint(path))
        specs = [parse_input_option(text) for text in inputs]
        _check_torchscript_inputs(path, specs, batch, permit.confined)
        return [Described(specs, fmt.name, {})]
    if inputs:
        raise UsageError(f"--input is for PyTorch factories and TorchScript archives; a {fmt.label} declares its "
                         "own inputs")
    if fmt.name == "onnx":
        return [Described(read_onnx_inputs(path), fmt.name, {})]
    if fmt.name == "huggingface":
        from ..formats.describe import huggingface_parts

        parts = huggingface_parts(path, task)
        note = _architecture_note(path, task, parts[0].task)
        if note:
            print(note, file=sys.stderr)
        return [Described([ModelInput(d.name, d.dtype, d.dims, d.value_range) for d in part.inputs], fmt.name,
                          part.ranges, part.task, part.part) for part in parts]
    from ..formats.describe import declared_inputs, default_dim_ranges

    if fmt.name in ("tensorflow", "keras"):
        from ..formats.tensorflow import require_tensorflow

        require_tensorflow()
    declared = declared_inputs(fmt, path, task, trust_code)
    specs = [ModelInput(d.name, d.dtype, d.dims, d.value_range) for d in declared]
    if not specs:
        raise UsageError(f"{model} has no inputs to feed")
    return [Described(specs, fmt.name, default_dim_ranges(fmt, path))]


def _architecture_note(folder: Path, task: str | None, chosen: str) -> str | None:
    """A note when config.json's architectures name a class no task maps (the base model's features are exported)."""
    from ..formats.hf_tasks import architecture_task, supported_tasks
    from ..formats.huggingface import read_config

    config = read_config(folder)
    if task is not None or architecture_task(config) is not None or not config.get("architectures"):
        return None
    return (f"note: config.json's architectures ({', '.join(config['architectures'])}) name no task export knows; "
            f"the recipe exports {chosen}. Tasks this model can do: {', '.join(supported_tasks(config))} (--task)")


def _torchscript_input_hint(path: Path) -> str:
    """An --input example named like the archive's forward() arguments (read without loading it)."""
    from ..formats.torch_probe import forward_names

    found = forward_names(path)
    names = found or ["input"]
    example = f"e.g. --input {names[0]}:batch,3,224,224:float32"
    if found is None or len(names) == 1:
        return example + (f" (forward() takes {names[0]})" if found else "")
    return f"forward() takes {', '.join(names)}: one --input each, {example}"


def _check_torchscript_inputs(path: Path, specs: list[ModelInput], batch: Range, confined: bool = True) -> None:
    """--input against the archive: forward()'s argument names (read without loading it), then one run at the
    given shapes in a child process; a mistake is named here, as export would name it."""
    from trtflow.errors import RecipeMismatch, did_you_mean

    from ..formats.torch_probe import forward_names, probe

    names = forward_names(path)
    given = [spec.name for spec in specs]
    if names is not None:
        unknown = [n for n in given if n not in names]
        if unknown:
            suggestion = did_you_mean(unknown[0], names)
            raise RecipeMismatch(f"--input {unknown[0]!r}: the model's forward() takes {', '.join(names) or 'nothing'}"
                                 + (f"; {suggestion}" if suggestion else ""),
                                 hint=f"name each --input like forward()'s argument: {', '.join(names)}")
        missing = [n for n in names if n not in given]
        if missing:
            raise RecipeMismatch(f"forward() also takes {', '.join(missing)}, which no --input gives",
                                 hint="give one --input per forward() argument")
    sizes = {"batch": max(2, batch.opt)}
    entries = {spec.name: {"shape": [d if isinstance(d, int) else sizes.get(d, 2) for d in spec.dims],
                           "dtype": spec.dtype, **({"low": 0, "high": 2} if spec.dtype.startswith("int") else {})}
               for spec in specs}
    found = probe(path, entries, confined)
    if found is not None:
        raise RecipeMismatch(f"--input: {found[0]}", hint=found[1])


def init(
    model: Annotated[str, typer.Argument(help="An ONNX file, a TorchScript archive (.pt/.pth/.ts; give --input), a "
                                              "torch.export program (.pt2), a Hugging Face model folder, a "
                                              "TensorFlow SavedModel folder or Keras file, or "
                                              "python:path/to/file.py:factory (a function returning a "
                                              "torch.nn.Module; THIS RUNS YOUR CODE when the recipe runs).",
                                         show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="The recipe file to write.")] = Path("recipe.yaml"),
    data: Annotated[Path | None, typer.Option(
        "--data", help="Real model inputs (.npz with one array per input, axis 0 = samples; .npy; or a directory of "
        "them) for calibration, validation and benchmarks. Without it the recipe uses random data.")] = None,
    inputs: Annotated[list[str] | None, typer.Option(
        "--input", help="For a factory or a TorchScript archive: NAME:DIMS[:DTYPE] per forward() argument, DIMS "
        "comma-separated, a name marks a dynamic dimension (input:batch,3,224,224:float32).")] = None,
    outputs: Annotated[list[str] | None, typer.Option(
        "--output-name", help="The names of the outputs, in order (default: the model's own names: a Hugging Face "
        "model's output fields, a signature's keys, a dict's keys; else output, or output_0, output_1...).")] = None,
    batch: Annotated[str | None, typer.Option(
        "--batch", help="MIN:OPT:MAX of the batch dimension (axis 0); default 1:8:32, 1:1:4 for a causal LM "
        "(generation).")] = None,
    dims: Annotated[list[str] | None, typer.Option(
        "--dim", help="NAME=MIN:OPT:MAX for another dynamic dimension, e.g. sequence=1:128:512.")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Recipe name (default: the model's).")] = None,
    task: Annotated[str | None, typer.Option(
        "--task", help="For a Hugging Face folder: the task whose head to export (default: from config.json's "
        "architectures; a causal LM gets text-generation-with-past, a generation recipe with a KV cache): "
        + ", ".join(TASK_NAMES) + ".")] = None,
    trust_code: Annotated[bool, typer.Option(
        "--trust-code", help="Trust the model file's own program (TorchScript, .pt2, SavedModel, Keras run code "
        "when read or traced): read it unconfined, and write trust_code: true into the recipe. Without it such a "
        "file is read in a child process the kernel confines, or refused where none is available.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing recipe file.")] = False,
) -> None:
    """Write a recipe for MODEL: profiles from its dynamic dimensions, fp32/fp16/int8 candidates validated and
    benchmarked, the best one selected, built and exported for Triton."""
    if output.exists() and not force:
        raise UsageError(f"{output} exists", hint="choose another --output, or --force to overwrite it")
    if task is not None and task not in TASK_NAMES:
        from trtflow.errors import did_you_mean

        suggestion = did_you_mean(task, list(TASK_NAMES))
        raise UsageError(f"--task {task!r} is not a task export knows" + (f"; {suggestion}" if suggestion else ""),
                         hint=f"tasks: {', '.join(TASK_NAMES)}")
    if not model.startswith("python:") and os.path.lexists(model):
        _inside_project(Path(model), output, "the model")  # before anything opens it
    if not model.startswith("python:") and Path(model).is_dir() and _is_generation(Path(model), task):
        _init_generation(model, output, data, batch or "1:1:4", dims or [], name, inputs or [])
        return
    seq2seq = _seq2seq_task(Path(model), task) if not model.startswith("python:") and Path(model).is_dir() else None
    if seq2seq is not None:
        _init_generation(model, output, data, batch or "1:1:4", dims or [], name, inputs or [], seq2seq)
        return
    chains = scaffold(model, output, data, inputs or [], outputs or None, batch or "1:8:32", dims or [], name, task,
                      trust_code)
    recipe_dir = output.absolute().parent
    recipe_dir.mkdir(parents=True, exist_ok=True)
    schema, schema_file = schema_reference(recipe_dir)
    _write(render(chains, schema), output, schema_file)
    err = sys.stderr
    for chain in chains:
        what = f"the {chain.part}" if chain.part else f"{len(chain.inputs)} input(s)"
        print(f"wrote {output}" + (f" (task {chain.task})" if chain.task else "") + f": {what}: "
              + "; ".join(s.describe() for s in chain.inputs), file=err)
        if chain.ranges:
            print(f"profile {chain.profile!r}: " + ", ".join(f"{k} {r.min}..{r.max} (opt {r.opt})"
                                                               for k, r in chain.ranges.items()), file=err)
    if chains[0].data_ref is None:
        print("WARNING: no --data given: the recipe calibrates, validates and benchmarks on RANDOM inputs; int8 "
              "accuracy on random data says little. Give real samples with --data samples.npz.", file=err)
    print(f"next: trtflow run {output}", file=err)


def _write(text: str, output: Path, schema_file: Path | None) -> None:
    """Check the recipe as `trtflow run` would load it, then write it (and the schema it names, when missing)."""
    from trtflow.userfiles import write_file

    _check_recipe(text, output)
    if schema_file is not None and not schema_file.exists():
        import json

        from trtflow.schema_export import recipe_json_schema

        write_file(schema_file, json.dumps(recipe_json_schema(), indent=2) + "\n")
    write_file(output, text)  # a random temporary file renamed over it: a link there is replaced, never followed


def _is_generation(folder: Path, task: str | None) -> bool:
    from .init_generation import is_generation

    return is_generation(folder, task)


def _seq2seq_task(folder: Path, task: str | None) -> str | None:
    from .init_seq2seq import seq2seq_task

    return seq2seq_task(folder, task)


def _init_generation(model: str, output: Path, data: Path | None, batch: str, dims: list[str], name: str | None,
                     inputs: list[str], seq2seq: str | None = None) -> None:
    """A generation recipe for a causal LM (`cli.init_generation`) or, with ``seq2seq`` (its task), an
    encoder-decoder (`cli.init_seq2seq`): prompts from --data, ranges from --dim."""
    from .init_generation import scaffold as generation_scaffold
    from .init_seq2seq import scaffold as seq2seq_scaffold

    if inputs:
        raise UsageError("--input is for PyTorch factories and TorchScript archives; a Hugging Face folder "
                         "declares its own inputs")
    path = Path(model)
    _inside_project(path, output, "the model")
    recipe_dir = output.absolute().parent
    batch_range = Range.parse(batch, "--batch")
    ranges = {}
    for item in dims:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--dim {item!r}: expected NAME=MIN:OPT:MAX, e.g. sequence_length=1:128:512")
        found = Range.parse(value, f"--dim {key}")
        ranges[key] = (found.min, found.opt, found.max)
    prompts_ref = None
    if data is not None:
        if data.suffix not in (".json", ".npy", ".npz") or not data.is_file():
            raise UsageError(f"--data {data}: a generation recipe takes prompts: a .json list of lists of token "
                             "ids, or a .npy/.npz 2-D integer array", hint="give a prompts file, or leave --data "
                             "out for random prompts")
        _inside_project(data, output, "--data")
        prompts_ref = os.path.relpath(data.absolute(), recipe_dir)
    sizes = (os.path.relpath(path.absolute(), recipe_dir), model, _recipe_name(name or path.absolute().name),
             (batch_range.min, batch_range.opt, batch_range.max), ranges, prompts_ref)
    plan: Any = seq2seq_scaffold(path, seq2seq, *sizes) if seq2seq else generation_scaffold(path, *sizes)
    recipe_dir.mkdir(parents=True, exist_ok=True)
    schema, schema_file = schema_reference(recipe_dir)
    _write(plan.render(schema, flow), output, schema_file)
    err = sys.stderr
    print(f"wrote {output}: {plan.headline()}", file=err)
    for line in plan.describe():
        print(line, file=err)
    print("WARNING: the int8 and fp16 candidates are calibrated on RANDOM inputs"
          + ("" if prompts_ref else ", and the generation checks use random prompts") + "; see the recipe's header",
          file=err)
    print(f"next: trtflow run {output}", file=err)


def _check_recipe(text: str, output: Path) -> None:
    """Load the recipe as `trtflow run` would (beside the target, so its paths resolve) before writing it."""
    import tempfile

    from trtflow.pipeline import load_pipeline

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=output.absolute().parent, delete=False) as tmp:
        tmp.write(text)
    try:
        load_pipeline(tmp.name)
    except RecipeError as exc:
        raise TrtflowError(f"the recipe for this model does not check: {exc.message}", hint=exc.hint) from None
    finally:
        os.unlink(tmp.name)
