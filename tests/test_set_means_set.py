"""Set means set (issue 42): a node's parameters travel written out in full (`trtflow.params.written_out`: the plan,
the job a worker reads, the journal, `trtflow show`), so what a stage does depends only on their values, never on
which fields a recipe wrote. A default that means "decide for me" is None (null in `trtflow show` and the schema):
benchmark's ``torch_cuda_graphs`` (generation: on; serving load: off) and prompts' ``count``/``length``/``seed``
(random prompts: 4, 8, 0; prompts from a file: none). An audit fails on code that reads which fields were set, the
recipes shipped read back as written, and both parameters are run through a recipe file and the CLI."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import trtflow_cli, trtflow_in_process
from tests.stages.test_generation import save_family
from trtflow.errors import InternalError
from trtflow.params import validated_params, written_out
from trtflow.stage import StageParams

#: one worker (CI: `--dist loadgroup`): the module-scoped project and its `trtflow init` made once per run
pytestmark = pytest.mark.xdist_group("set_means_set")
REPO = Path(__file__).resolve().parent.parent
#: Where a stage's behaviour could rest on which fields a recipe wrote: pydantic's fields-set, read or dumped.
FIELDS_SET = {"model_fields_set", "__pydantic_fields_set__", "__fields_set__", "exclude_unset", "exclude_defaults"}
OWNER = "trtflow/params.py"


def fields_set_reads(source: str) -> list[str]:
    """Lines of ``source`` that read which fields of a pydantic model were set (`FIELDS_SET`), and lines that
    validate a stage's parameters (``<x>.params.model_validate``) around `trtflow.params.validated_params`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
            if (node.attr == "model_validate" and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "params"):
                names.append("params.model_validate")
        elif isinstance(node, (ast.keyword, ast.arg)) and node.arg:  # dump(exclude_unset=...), def f(exclude_unset)
            names.append(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.append(node.value)  # getattr(model, "model_fields_set")
        found += [(node.lineno, name) for name in names if name in FIELDS_SET or name == "params.model_validate"]
    return [f"{line}: {name}" for line, name in sorted(found)]


def test_the_audit_finds_what_the_old_code_did():
    old = ('def generation_cuda_graphs(self):\n'
           '    return self.torch_cuda_graphs if "torch_cuda_graphs" in self.model_fields_set else True\n'
           'request = {"params": params.model_dump(mode="json", exclude_unset=True)}\n'
           'params = stage.params.model_validate(job.params)\n'
           'flags = getattr(model, "__pydantic_fields_set__")\n')
    assert fields_set_reads(old) == ["2: model_fields_set", "3: exclude_unset", "4: params.model_validate",
                                     "5: __pydantic_fields_set__"]


def test_no_code_asks_which_fields_were_set():
    """trtflow/, stages/ and bench/: nothing reads the fields-set; a stage's parameters are validated by
    `trtflow.params.validated_params` only."""
    offenders = [f"{path.relative_to(REPO)}:{line}"
                 for folder in ("trtflow", "stages", "bench") for path in sorted((REPO / folder).rglob("*.py"))
                 if path.relative_to(REPO).as_posix() != OWNER
                 for line in fields_set_reads(path.read_text(encoding="utf-8"))]
    assert offenders == [], "a node's parameters travel written out in full: see trtflow/params.py"


def test_a_stage_whose_parameters_do_not_read_back_is_refused_naming_it():
    from pydantic import model_validator

    class Prompts(StageParams):  # issue 42's Prompts: a default written out read as a choice
        path: str | None = None
        count: int = 4

        @model_validator(mode="after")
        def _one_source(self) -> Prompts:
            if self.path is not None and "count" in self.model_fields_set:
                raise ValueError("give either path or count")
            return self

    assert written_out("ok", Prompts())[0] == {"path": None, "count": 4}
    with pytest.raises(InternalError, match="stage 'old': its parameters, written out, are refused when read back "
                       r"\(: Value error, give either path or count\); a default that means 'decide for me'"):
        written_out("old", Prompts(path="p.json"))


@pytest.mark.parametrize("recipe", sorted(p.name for p in (REPO / "pipelines").glob("*.yaml")))
def test_every_shipped_recipe_reads_back_as_written(recipe, tmp_path):
    """The differential check on the recipes the project ships: every node's written-out parameters, validated
    again as a worker does, give the same parameters (expansion refuses a node whose do not); and the recipe with
    every default written out in its file (the nodes without a matrix) plans the same parameters."""
    from trtflow.recipe.expand import expand
    from trtflow.recipe.load import load_recipe
    from trtflow.registry import get_stage

    nodes = expand(load_recipe(REPO / "pipelines" / recipe), get_stage)
    assert nodes
    for node in nodes:
        again = validated_params(get_stage(node.stage).params, node.params)
        assert again.model_dump(mode="json") == node.params == node.params_model.model_dump(mode="json")
    raw = yaml.safe_load((REPO / "pipelines" / recipe).read_text())
    planned = {node.name: node.params for node in nodes}
    written = [spec for spec in raw["nodes"] if not spec.get("matrix") and spec["name"] in planned]
    for spec in written:
        spec["params"] = planned[spec["name"]]
    (tmp_path / recipe).write_text(yaml.safe_dump(raw, sort_keys=False))
    assert written and {node.name: node.params for node in expand(load_recipe(tmp_path / recipe), get_stage)
                        } == planned


# -- torch_cuda_graphs: null decides (generation on PyTorch: on), false turns them off ---------------------------
GENERATION_BENCHMARK = {"backend": "torch", "device": "cpu", "hf_model": "llama",
                        "generation": {"context_length": 8, "new_tokens": 4, "concurrency": [1]}, "repeats": 2,
                        "min_duration_s": 0.05, "max_duration_s": 0.1, "min_iterations": 4, "warmup_ms": 0}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("setmeansset")
    (folder / "pyproject.toml").write_text("")
    save_family(folder, "llama")
    (folder / "prompts.json").write_text(json.dumps([[1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11, 12]]))
    return folder


def show(project: Path, recipe: str, node: str, *sets: str) -> dict:
    args = [arg for value in sets for arg in ("--set", value)]
    return json.loads(trtflow_in_process("show", recipe, node, "--json", *args, cwd=project).stdout)


@pytest.mark.slow  # two generation benchmarks of a tiny Llama on PyTorch, in node processes
def test_generation_on_pytorch_asks_for_cuda_graphs_unless_the_recipe_says_false(project):
    """Through a recipe file and `trtflow run`: the node that leaves torch_cuda_graphs out asks for CUDA graphs
    (on the CPU they cannot be captured: `cuda_graphs_off` says "not on a CUDA device"), the one that writes
    ``false`` does not ("not asked"). Before, both nodes' workers read the written-out default (false) as the
    recipe's choice and ran eagerly: "not asked" on a GPU for every recipe."""
    recipe = {"name": "graphs", "nodes": [
        {"name": "decide", "stage": "benchmark", "params": GENERATION_BENCHMARK},
        {"name": "eager", "stage": "benchmark", "params": {**GENERATION_BENCHMARK, "torch_cuda_graphs": False}}]}
    (project / "graphs.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    assert show(project, "graphs.yaml", "decide")["params"]["torch_cuda_graphs"] is None  # null: trtflow decides
    assert show(project, "graphs.yaml", "eager")["params"]["torch_cuda_graphs"] is False
    set_false = show(project, "graphs.yaml", "decide", "nodes.decide.params.torch_cuda_graphs=false")
    assert set_false["params"]["torch_cuda_graphs"] is False
    assert set_false["key"] != show(project, "graphs.yaml", "decide")["key"]  # a choice is not the default
    trtflow_cli("run", "graphs.yaml", cwd=project)
    torch = {node: json.loads((project / "build" / "graphs" / node / "benchmark.json").read_text())["method"]["torch"]
             for node in ("decide", "eager")}
    assert torch["decide"]["cuda_graphs_off"] == "not on a CUDA device"  # asked for; this machine has no GPU
    assert torch["eager"]["cuda_graphs_off"] == "not asked"


def test_the_schema_says_null_for_decide(tmp_path):
    """`trtflow schema`: the defaults that mean "decide for me" are null, and null may be written."""
    trtflow_in_process("schema", "--builtin", "-o", "schema.json", cwd=tmp_path)
    defs = json.loads((tmp_path / "schema.json").read_text())["$defs"]
    for fields in (defs["benchmark_params"]["properties"]["torch_cuda_graphs"],
                   *(defs["Prompts"]["properties"][name] for name in ("count", "length", "seed"))):
        assert fields["default"] is None and {"type": "null"} in fields["anyOf"]


def test_serving_load_on_pytorch_keeps_cuda_graphs_off_unless_asked():
    from trtflow_stages import benchmark

    serving = {"backend": "torch", "device": "cuda", "torch_model": "python:m.py:make", "concurrency": [2]}
    read = written_out("benchmark", benchmark.Params.model_validate(serving))[1]
    assert read.torch_cuda_graphs is None and not read.serving_cuda_graphs
    asked = benchmark.Params.model_validate({**serving, "torch_cuda_graphs": True})
    assert written_out("benchmark", asked)[1].serving_cuda_graphs
    generation = benchmark.Params.model_validate({**GENERATION_BENCHMARK, "device": "cuda"})
    assert written_out("benchmark", generation)[1].generation_cuda_graphs


# -- prompts: {path: ...} as `trtflow init --data` writes it ---------------------------------------------------
@pytest.fixture(scope="module")
def init_with_prompts(project) -> dict:
    trtflow_in_process("init", "llama", "--data", "prompts.json", "-o", "recipe.yaml", "--force", cwd=project)
    return yaml.safe_load((project / "recipe.yaml").read_text())


def reads_back(params: dict) -> dict:
    """``params`` as a worker reads them: the export stage's parameters from their written-out form."""
    from trtflow_stages import export

    return validated_params(export.Params, params).model_dump(mode="json")


@pytest.mark.slow  # `trtflow init` on a causal LM
def test_prompts_from_a_file_survive_the_recipe_set_extends_and_matrix(project, init_with_prompts):
    """`trtflow init MODEL --data prompts.json`'s recipe, a --set, an extends: base and a matrix: each export
    node's parameters, as `trtflow show` prints them (what its worker receives), read back as themselves, the
    prompts' count/length/seed null. Before, they were written out as 4/8/0 and read back as "path and count"."""
    nodes = {node["name"]: node for node in init_with_prompts["nodes"]}
    assert nodes["export"]["params"]["generation"]["prompts"] == {"path": "prompts.json"}
    from_file = {"path": "prompts.json", "count": None, "length": None, "seed": None}
    params = show(project, "recipe.yaml", "export")["params"]
    assert params["generation"]["prompts"] == from_file and reads_back(params) == params
    # --set onto a recipe whose export draws random prompts
    random_recipe = yaml.safe_load((project / "recipe.yaml").read_text())
    random_recipe["nodes"][0]["params"]["generation"]["prompts"] = {}
    (project / "random.yaml").write_text(yaml.safe_dump(random_recipe, sort_keys=False))
    assert show(project, "random.yaml", "export")["params"]["generation"]["prompts"] == {
        "path": None, "count": 4, "length": 8, "seed": 0}
    params = show(project, "random.yaml", "export", "nodes.export.params.generation.prompts.path=prompts.json")
    assert params["params"]["generation"]["prompts"] == from_file and reads_back(params["params"]) == params["params"]
    # extends: a base with the file's prompts, and a matrix over the file
    (project / "more.json").write_text(json.dumps([[3, 2, 1]]))
    matrixed = {**nodes["export"]["params"], "generation": {"prompts": {"path": "${{ matrix.file }}"},
                                                            "new_tokens": 16}}
    (project / "child.yaml").write_text(yaml.safe_dump({
        "extends": "recipe.yaml", "name": "child",
        "nodes": [{"name": "export-matrix", "stage": "export", "params": matrixed,
                   "matrix": {"file": ["prompts.json", "more.json"]}}]}, sort_keys=False))
    plan = trtflow_in_process("plan", "child.yaml", "--json", cwd=project)
    variants = [n["node"] for n in json.loads(plan.stdout) if n["node"].startswith("export-matrix")]
    assert len(variants) == 2
    for node, file in [("export", "prompts.json"), *zip(variants, ["prompts.json", "more.json"], strict=True)]:
        shown = show(project, "child.yaml", node)["params"]  # the base's export (extends) and the matrix's
        assert shown["generation"]["prompts"] == {**from_file, "path": file} and reads_back(shown) == shown


@pytest.mark.slow  # export of a tiny Llama with its generation check, in a node process
def test_the_init_recipe_with_prompts_from_a_file_exports(project, init_with_prompts):
    """The node `trtflow init MODEL --data prompts.json` recommends for real prompts runs: before, its worker
    refused the parameters (ValidationError ... generation.prompts) and every node after it was never run."""
    run = trtflow_cli("run", "recipe.yaml", "export", cwd=project, check=None)
    assert run.returncode == 0 and "ValidationError" not in run.stderr, run.stderr
    checked = show(project, "recipe.yaml", "export")["summary"]["generation_check"]["per_prompt"]
    assert [prompt["prompt_length"] for prompt in checked] == [4, 5, 3]  # prompts.json's, not random ones


def test_a_parameter_written_beside_its_matrix_is_refused_not_silently_kept(tmp_path):
    """`matrix: {precision: [fp16, bf16]}` with `params: {precision: fp16}` (the default written out) made every
    variant fp16 while leaving it out made convert-bf16 bf16: writing a default changed what ran. A written value
    that contradicts the matrix is refused, naming the line; `${{ matrix.KEY }}` and an agreeing value still plan."""
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "m.py").write_text("def build():\n    raise NotImplementedError  # planned, never run\n")
    body = ("name: mx\nnodes:\n  - name: export\n    stage: export\n    params: {model: 'python:m.py:build', "
            "inputs: {input: {shape: [2, 16]}}}\n  - name: convert\n    stage: convert\n"
            "    matrix: {precision: [fp16, bf16]}\n    inputs: {model: export}\n")
    (tmp_path / "written.yaml").write_text(body + "    params: {precision: fp16}\n")
    proc = trtflow_in_process("plan", "written.yaml", cwd=tmp_path, check=None)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "written.yaml:10" in proc.stderr and "params.precision is 'fp16' but its matrix sets precision to 'bf16'" \
        in proc.stderr, proc.stderr
    proc = trtflow_in_process("plan", "written.yaml", "--set", "nodes.convert.params.precision=bf16", cwd=tmp_path,
                              check=None)
    assert proc.returncode == 2 and "matrix sets precision to 'fp16'" in proc.stderr, proc.stderr
    (tmp_path / "ref.yaml").write_text(body + "    params: {precision: '${{ matrix.precision }}'}\n")
    (tmp_path / "left.yaml").write_text(body)
    for recipe in ("ref.yaml", "left.yaml"):
        assert show(tmp_path, recipe, "convert-bf16")["params"]["precision"] == "bf16"
