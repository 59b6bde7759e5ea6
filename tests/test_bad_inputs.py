"""A catalogue of bad inputs: each gives a clear error naming what is wrong, where, and the right exit code.

Recipe-level errors are checked in-process (load_pipeline + plan raise RecipeError, exit code 2) and a
sample of them again through the real CLI. Errors that only a stage can find (corrupt ONNX files,
profiles that do not fit the model, calibration data of the wrong shape, an unavailable backend) run the
real CLI on tiny real models; their "location" is the node named in the message. docs/errors.md lists
the same errors for users, with their fixes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from reliability.plugins import activate_in_process, subprocess_env, write_plugin_distribution

from trtflow.environment import Environment
from trtflow.errors import EXIT_USAGE, RecipeError
from trtflow.pipeline import load_pipeline
from trtflow.plan import make_plan
from trtflow.recipe import yaml_data
from trtflow.storage.store import Store


@dataclass
class Bad:
    id: str
    recipe: str
    message: str  # a regular expression the error message must match
    where: str  # "recipe.yaml:LINE" (file and line in the message) or "node:NAME" (node named in the message)
    files: dict[str, str | bytes] = field(default_factory=dict)  # other files next to the recipe
    overrides: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    symlinks: dict[str, str] = field(default_factory=dict)  # link name -> target (relative to tmp_path)
    hint: str | None = None  # a regular expression the hint must match
    fifos: tuple[str, ...] = ()  # named pipes to create next to the recipe


def r(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


SYNTH = "  - {name: a, stage: synth}\n"
# `<<:` nested eight deep, 9 merges a level: 9**8 values if expanded (took 60-90 s and 580 MB before it was refused)
MERGE_BOMB = "name: x\n" + "".join(
    f"m{i}: &m{i} {{<<: [" + ", ".join([f"*m{i - 1}"] * 9) + f"], k{i}: v}}\n" if i else "m0: &m0 {k0: v}\n"
    for i in range(9)) + "nodes:\n" + SYNTH
# An alias bomb through --set (a 412-character one spun for minutes: --set skipped the alias limit)
SET_ALIAS_BOMB = "[" + ", ".join(["&a [x, x, x, x, x, x, x, x, x, x]"] + [
    f"&{c} [" + ", ".join([f"*{p}"] * 10) + "]" for p, c in zip("abcdefg", "bcdefgh", strict=True)]) + "]"

CATALOGUE: list[Bad] = [
    # ------------------------------------------------------------------ YAML itself
    Bad("yaml-unclosed-flow", r("""
        name: x
        nodes:
          - {name: a, stage: synth
        """), r"YAML syntax error: ", "recipe.yaml:4"),  # the parser's own words follow: they vary
    Bad("yaml-bad-indentation", r("""
        name: x
        nodes:
          - name: a
             stage: synth
        """), r"YAML syntax error: mapping values are not allowed", "recipe.yaml:4"),
    Bad("yaml-tab-indent", "name: x\nnodes:\n\t- name: a\n",
        r"YAML syntax error: .*\(a tab\)", "recipe.yaml:3",
        hint="never tabs"),
    Bad("yaml-duplicate-key", r("""
        name: x
        nodes:
          - name: a
            stage: synth
            stage: export
        """), r"duplicate key 'stage'", "recipe.yaml:5", hint="each key may appear once"),
    Bad("yaml-python-object-tag", r("""
        name: x
        nodes:
          - name: a
            stage: !!python/object/apply:os.system ["echo pwned"]
        """), r"YAML tag 'tag:yaml.org,2002:python/object/apply:os.system' is not allowed", "recipe.yaml:4",
        hint="never construct objects"),
    Bad("yaml-custom-tag", r("""
        name: x
        nodes: !include other.yaml
        """), r"YAML tag '!include' is not allowed", "recipe.yaml:2"),
    Bad("yaml-binary-tag", "name: x\nnodes:\n  - {name: a, stage: synth, params: {text: !!binary aGVsbG8=}}\n",
        r"YAML tag 'tag:yaml.org,2002:binary' is not allowed", "recipe.yaml:3"),
    Bad("yaml-complex-key", "name: x\n? [a, b]\n: 1\nnodes:\n" + SYNTH, r"a mapping key must be a plain value",
        "recipe.yaml:2"),
    Bad("yaml-billion-laughs", "name: x\n" + "\n".join(
        [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" if i else "l0: &l0 [lol, lol, lol, lol]"
         for i in range(8)]) + "\nnodes:\n" + SYNTH,
        r"aliases and merge keys expand to more than 100000 values \(an alias bomb\?\)", "recipe.yaml:7:15"),
    # ------------------------------------------------------------------ hostile YAML: refused before it grows
    Bad("yaml-merge-key-bomb", MERGE_BOMB, r"aliases and merge keys expand to more than 100000 values",
        "recipe.yaml:7:40"),
    Bad("yaml-recursive-alias", "name: x\nloop: &l [a, *l]\nnodes:\n" + SYNTH,
        r"alias \*l is used inside the node it names", "recipe.yaml:2:14"),
    Bad("yaml-undefined-alias", "name: x\nnodes:\n  - {name: a, stage: synth, params: {text: *nowhere}}\n",
        r"alias \*nowhere refers to no anchor &nowhere defined before it", "recipe.yaml:3:44"),
    Bad("yaml-duplicate-anchor", "name: &n x\ndescription: &n y\nnodes:\n" + SYNTH,
        r"anchor &n is defined twice", "recipe.yaml:2:14"),
    Bad("yaml-merge-of-a-scalar", "name: x\nbase: &b 3\nnodes:\n  - {<<: *b, name: a, stage: synth}\n",
        r"a merge key '<<' takes a mapping or a list of mappings", "recipe.yaml:4:"),
    Bad("yaml-nested-500-deep", "name: x\nnodes:\n  - {name: a, stage: synth, params: {text: "
        + "[" * 500 + "]" * 500 + "}}\n", r"values nested more than 64 levels deep", "recipe.yaml:3:"),
    Bad("yaml-nested-200000-deep", "name: x\nnodes: " + "[" * 200_000 + "]" * 200_000 + "\n",
        r"values nested more than 64 levels deep", "recipe.yaml:2:"),
    # Deeper than the parser allows (libyaml 0.2.6+: 1000 levels): it refuses them before we see them, on one line
    Bad("yaml-nested-unclosed-on-one-line", "name: x\nnodes: " + "[" * 5000 + "\n",
        r"values nested more than 64 levels deep", "recipe.yaml:2:", hint="check the brackets"),
    Bad("yaml-nested-json-objects", "name: x\nnodes: " + '{"a": ' * 3000 + "1" + "}" * 3000 + "\n",
        r"values nested more than 64 levels deep", "recipe.yaml:2:"),
    Bad("yaml-nested-compact-block-sequences", "name: x\nnodes:\n  " + "- " * 3000 + "x\n",
        r"values nested more than 64 levels deep", "recipe.yaml:3:"),
    Bad("yaml-nested-in-block-then-flow", "name: x\nnodes:\n" + "".join(" " * (2 * i) + f"k{i}:\n" for i in range(30))
        + " " * 60 + "[" * 2000 + "]" * 2000 + "\n", r"values nested more than 64 levels deep", "recipe.yaml:33:"),
    Bad("yaml-nested-through-aliases", "name: x\ndeep: &d " + "[" * 40 + "]" * 40 + "\nnodes: " + "[" * 30 + "*d"
        + "]" * 30 + "\n", r"values nested more than 64 levels deep", "recipe.yaml:3:"),
    Bad("yaml-nested-block-mappings", "name: x\nnodes:\n" + "".join(" " * (2 * i) + f"k{i}:\n" for i in range(70))
        + " " * 140 + "v\n", r"values nested more than 64 levels deep", "recipe.yaml:"),
    Bad("yaml-integer-of-5000-digits", "name: x\nnodes:\n  - {name: a, stage: synth, params: {size: "
        + "7" * 5000 + "}}\n", r"an integer of 5000 digits \(at most 100\)", "recipe.yaml:3:44",
        hint="quote it"),
    Bad("yaml-sexagesimal-integer", "name: x\nnodes:\n  - {name: a, stage: synth, params: {size: "
        + ":".join(["59"] * 3000) + "}}\n", r"an integer of 8999 digits", "recipe.yaml:3:44"),
    Bad("yaml-huge-scalar", "name: x\nnodes:\n  - {name: a, stage: synth, params: {text: "
        + "a" * ((1 << 20) + 1) + "}}\n", r"a value of 1048577 characters \(a recipe value may have at most",
        "recipe.yaml:3:44"),
    # A key written without '?' may have at most 1024 characters (the parser's rule); with '?', ours, the same
    Bad("yaml-key-too-long", "name: x\n" + "k" * 2000 + ": 1\nnodes:\n" + SYNTH,
        r"a mapping key of 2000 characters \(at most 1024\)", "recipe.yaml:2:1", hint="shorten"),
    Bad("yaml-key-too-long-in-a-flow-mapping", "name: x\nnodes:\n  - {name: a, stage: synth, params: {"
        + "k" * 1025 + ": 1}}\n", r"a mapping key of 1025 characters \(at most 1024\)", "recipe.yaml:3:38"),
    Bad("yaml-key-too-long-quoted", "name: x\nnodes:\n  - name: a\n    '" + "k" * 3000 + "': 1\n",
        r"a mapping key of 3002 characters \(at most 1024\)", "recipe.yaml:4:5"),
    Bad("yaml-key-too-long-explicit", "name: x\n? " + "k" * 2000 + "\n: 1\nnodes:\n" + SYNTH,
        r"a mapping key of 2000 characters \(at most 1024\)", "recipe.yaml:2:3"),
    Bad("yaml-two-documents", "name: x\nnodes:\n" + SYNTH + "---\nname: y\n",
        r"the file holds more than one YAML document", "recipe.yaml:4:1"),
    Bad("yaml-invalid-explicit-int", "name: x\nnodes:\n  - {name: a, stage: synth, params: {size: !!int ''}}\n",
        r"'' is not a valid int", "recipe.yaml:3:"),
    Bad("yaml-control-character", "name: x\x07\nnodes:\n" + SYNTH,
        r"YAML error: character #x0007 is not allowed in YAML text \(a control character\)", "recipe.yaml:1:8"),
    Bad("yaml-control-character-after-accents", "name: caf\u00e9\nnodes: \x07\n",
        r"YAML error: character #x0007 is not allowed", "recipe.yaml:2:8"),
    Bad("empty-file", "", r"the recipe is empty", "recipe.yaml:1", hint="needs at least 'name' and 'nodes'"),
    Bad("comments-only", "# nothing here\n", r"the recipe is empty", "recipe.yaml:1"),
    Bad("not-a-mapping", "- name: a\n  stage: synth\n", r"a recipe must be a mapping with 'name' and 'nodes'",
        "recipe.yaml:1"),
    Bad("not-utf8", b"name: caf\xe9\nnodes: []\n", r"cannot read recipe .*recipe.yaml.*utf-8", "recipe.yaml"),
    # ------------------------------------------------------------------ recipe schema
    Bad("missing-name", "nodes:\n" + SYNTH, r"required field 'name' is missing", "recipe.yaml:1"),
    Bad("missing-nodes", "name: x\n", r"required field 'nodes' is missing", "recipe.yaml:1"),
    Bad("no-nodes", "name: x\nnodes: []\n", r"nodes: List should have at least 1 item", "recipe.yaml:2"),
    Bad("unknown-top-level-key", "name: x\nnode:\n" + SYNTH,
        r"unknown key 'node'; did you mean 'nodes'\?", "recipe.yaml:2"),
    Bad("unknown-node-key", r("""
        name: x
        nodes:
          - name: a
            stage: synth
            parmas: {size: 3}
        """), r"nodes\.0\.parmas: unknown key 'parmas'; did you mean 'params'\?", "recipe.yaml:5"),
    Bad("nodes-not-a-list", "name: x\nnodes:\n  a: {stage: synth}\n", r"nodes: Input should be a valid list",
        "recipe.yaml:3"),
    Bad("params-not-a-mapping", "name: x\nnodes:\n  - {name: a, stage: synth, params: [1, 2]}\n",
        r"nodes\.0\.params: Input should be a valid dictionary", "recipe.yaml:3"),
    Bad("bad-node-name", "name: x\nnodes:\n  - {name: my node, stage: synth}\n",
        r"nodes\.0\.name: String should match pattern .* \(got 'my node'\)", "recipe.yaml:3"),
    Bad("bad-recipe-name", "name: my/recipe\nnodes:\n" + SYNTH, r"name: String should match pattern",
        "recipe.yaml:1"),
    Bad("unsupported-version", "version: 2\nname: x\nnodes:\n" + SYNTH, r"version: Input should be 1 \(got 2\)",
        "recipe.yaml:1"),
    Bad("enabled-not-bool", "name: x\nnodes:\n  - {name: a, stage: synth, enabled: maybe}\n",
        r"nodes\.0\.enabled: Input should be a valid boolean", "recipe.yaml:3"),
    Bad("timeout-not-positive", "name: x\nnodes:\n  - {name: a, stage: synth, timeout: 0}\n",
        r"nodes\.0\.timeout: Input should be greater than 0", "recipe.yaml:3"),
    Bad("profile-not-shapes", r("""
        name: x
        profiles:
          small: {input: {min: [1, 16], opt: [1, 16]}}
        nodes:
          - {name: a, stage: synth}
        """), r"profiles\.small\.input\.max: required field 'max' is missing", "recipe.yaml:3"),
    # ------------------------------------------------------------------ stages and their parameters
    Bad("unknown-stage", "name: x\nnodes:\n  - {name: a, stage: synht}\n", r"unknown stage 'synht'",
        "recipe.yaml:3", hint="did you mean 'synth'"),
    Bad("unknown-param", r("""
        name: x
        nodes:
          - name: a
            stage: synth
            params:
              szie: 3
        """), r"nodes\.0\.params\.szie: unknown key 'szie'; did you mean 'size'\?", "recipe.yaml:6"),
    Bad("param-wrong-type", r("""
        name: x
        nodes:
          - name: a
            stage: synth
            params:
              size: big
        """), r"nodes\.0\.params\.size: Input should be a valid integer.*\(got 'big'\)", "recipe.yaml:6"),
    Bad("param-out-of-range", "name: x\nnodes:\n  - {name: a, stage: synth, params: {size: -5}}\n",
        r"params\.size: Input should be greater than or equal to 0 \(got -5\)", "recipe.yaml:3"),
    Bad("param-infinite", "name: x\nnodes:\n  - {name: a, stage: synth, params: {size: .inf}}\n",
        r"params\.size: .*\(got inf\)", "recipe.yaml:3"),
    Bad("stage-defaults-unknown-param", r("""
        name: x
        defaults:
          synth: {colour: red}
        nodes:
          - {name: a, stage: synth}
        """), r"unknown key 'colour'", "recipe.yaml:3:"),
    Bad("export-model-form", "name: x\nnodes:\n  - {name: e, stage: export, params: {model: resnet50}}\n",
        r"node 'e': file 'resnet50' not found \(looked at ", "recipe.yaml:3"),
    Bad("export-torch-without-inputs",
        "name: x\nnodes:\n  - {name: e, stage: export, params: {model: 'python:m.py:build'}}\n",
        r"'inputs' is required to export a PyTorch factory or a TorchScript archive", "recipe.yaml:3",
        files={"m.py": "def build(): ...\n"}),
    Bad("build-shapes-min-greater-than-opt", r("""
        name: x
        profiles:
          bs: {input: {min: [8, 16], opt: [1, 16], max: [8, 16]}}
        nodes:
          - {name: e, stage: export, params: {model: m.onnx}}
          - {name: b, stage: build, params: {profile: bs}}
        """), r"need min <= opt <= max in every dimension, but dimension 0 has min=8, opt=1, max=8",
        "recipe.yaml:3", files={"m.onnx": "x"}),
    Bad("build-shapes-wrong-rank", r("""
        name: x
        profiles:
          bs: {input: {min: [1, 16], opt: [1, 16, 1], max: [1, 16]}}
        nodes:
          - {name: e, stage: export, params: {model: m.onnx}}
          - {name: b, stage: build, params: {profile: bs}}
        """), r"min, opt and max must have the same rank, got min=\[1, 16\] \(rank 2\), opt=\[1, 16, 1\] \(rank 3\)",
        "recipe.yaml:3", files={"m.onnx": "x"}),
    Bad("build-unknown-profile", r("""
        name: x
        profiles:
          batch1: {input: {min: [1, 16], opt: [1, 16], max: [1, 16]}}
        nodes:
          - {name: e, stage: export, params: {model: m.onnx}}
          - {name: b, stage: build, params: {profile: batch_1}}
        """), r"unknown profile 'batch_1'", "recipe.yaml:6", files={"m.onnx": "x"}, hint="did you mean 'batch1'"),
    Bad("build-bad-workspace", r("""
        name: x
        nodes:
          - {name: e, stage: export, params: {model: m.onnx}}
          - {name: b, stage: build, params: {workspace: lots}}
        """), r"workspace: cannot read 'lots' as a size", "recipe.yaml:4", files={"m.onnx": "x"}),
    # ------------------------------------------------------------------ the model a recipe names (issue 25)
    Bad("export-unknown-task", "name: x\nnodes:\n  - {name: e, stage: export, params: {model: bert, task: "
        "text-clasification}}\n", r"task 'text-clasification' is not a task export knows; did you mean "
        r"'text-classification'\?", "recipe.yaml:3", files={"bert/config.json": '{"model_type": "bert"}',
                                                            "bert/model.safetensors": "w"}),
    Bad("export-folder-without-config", "name: x\nnodes:\n  - {name: e, stage: export, params: {model: bert}}\n",
        r"the folder 'bert' is neither a Hugging Face model folder \(no config.json\) nor a TensorFlow SavedModel",
        "recipe.yaml:3", files={"bert/model.safetensors": "weights"}, hint="point model: at"),
    Bad("export-hf-folder-without-weights", "name: x\nnodes:\n  - {name: e, stage: export, params: {model: bert}}\n",
        r"the Hugging Face folder 'bert' has a config but no weights", "recipe.yaml:3",
        files={"bert/config.json": '{"model_type": "bert"}'}, hint="save_pretrained"),
    Bad("export-task-for-an-onnx-file", "name: x\nnodes:\n  - {name: e, stage: export, params: {model: m.onnx, "
        "task: fill-mask}}\n", r"task: and part: are for Hugging Face model folders; 'm.onnx' is not "
        r"one \(ONNX file\)",
        "recipe.yaml:3", files={"m.onnx": "x"}),
    Bad("export-torchscript-that-is-a-pickle", "name: x\nnodes:\n  - {name: e, stage: export, params: {model: m.pt, "
        "inputs: {x: {shape: [1, 2]}}}}\n", r"'m.pt' is not a TorchScript archive: not a zip archive",
        "recipe.yaml:3", files={"m.pt": b"\x80\x04not a zip"}),
    # ------------------------------------------------------------------ the graph
    Bad("duplicate-node-name", r("""
        name: x
        nodes:
          - {name: a, stage: synth}
          - {name: a, stage: synth, params: {text: other}}
        """), r"duplicate node name 'a' \(also defined at recipe.yaml:3", "recipe.yaml:4"),
    Bad("matrix-variant-names-collide", r("""
        name: x
        nodes:
          - name: a
            stage: synth
            matrix: {text: [a b, a_b]}
        """), r"duplicate node name 'a-a_b'", "recipe.yaml:3", hint="unique name"),
    Bad("unknown-input-node", r("""
        name: x
        nodes:
          - {name: source_node, stage: synth}
          - {name: b, stage: synth, inputs: {source: sorce_node}}
        """), r"node 'b': input 'source' refers to unknown node 'sorce_node'", "recipe.yaml:4",
        hint="did you mean 'source_node'"),
    Bad("unknown-input-slot", r("""
        name: x
        nodes:
          - {name: a, stage: synth}
          - {name: b, stage: synth, inputs: {sauce: a}}
        """), r"node 'b': stage 'synth' has no input 'sauce'", "recipe.yaml:4", hint="did you mean 'source'"),
    Bad("unknown-output", r("""
        name: x
        nodes:
          - {name: a, stage: synth}
          - {name: b, stage: synth, inputs: {source: a.dat}}
        """), r"node 'b': 'a' has no output 'dat'", "recipe.yaml:4", hint="did you mean 'data'"),
    Bad("self-reference", "name: x\nnodes:\n  - {name: a, stage: synth, inputs: {source: a}}\n",
        r"node 'a' uses its own output as input 'source'", "recipe.yaml:3"),
    Bad("cycle", r("""
        name: x
        nodes:
          - {name: a, stage: synth, inputs: {source: c}}
          - {name: b, stage: synth, inputs: {source: a}}
          - {name: c, stage: synth, inputs: {source: b}}
        """), r"the nodes form a cycle: a -> c -> b -> a", "recipe.yaml:3"),
    Bad("two-artifacts-for-one-input", r("""
        name: x
        nodes:
          - {name: a, stage: synth}
          - {name: b, stage: synth}
          - {name: c, stage: synth, inputs: {source: [a, b]}}
        """), r"input 'source' takes one artifact but the references give 2", "recipe.yaml:5"),
    Bad("missing-required-input", "name: x\nnodes:\n  - {name: s, stage: simplify}\n",
        r"node 's' needs input 'model' \(onnx\) but no earlier node produces one", "recipe.yaml:3"),
    Bad("input-of-wrong-kind", r("""
        name: x
        nodes:
          - {name: a, stage: synth}
          - {name: s, stage: simplify, inputs: {model: a}}
        """), r"input 'model' takes onnx but 'a' \(synth\) produces none", "recipe.yaml:4"),
    Bad("ambiguous-matrix-input", r("""
        name: x
        nodes:
          - {name: a, stage: synth, matrix: {text: [x, y]}}
          - {name: b, stage: synth, inputs: {source: a}}
        """), r"input 'source' refers to 'a', which has 2 variants \(a-x, a-y\)", "recipe.yaml:4"),
    # ------------------------------------------------------------------ matrix
    Bad("matrix-empty-values", "name: x\nnodes:\n  - {name: a, stage: synth, matrix: {size: []}}\n",
        r"matrix key 'size' has no values", "recipe.yaml:3"),
    Bad("matrix-misspelled-key", r("""
        name: x
        nodes:
          - name: a
            stage: synth
            matrix:
              sise: [1, 2]
        """), r"matrix key 'sise' is not a parameter of stage 'synth'", "recipe.yaml:6",
        hint="did you mean 'size'"),
    Bad("matrix-reference-without-key", r("""
        name: x
        nodes:
          - name: a
            stage: synth
            matrix: {size: [1, 2]}
            params: {text: "${{ matrix.sizes }}"}
        """), r"\$\{\{ matrix.sizes \}\} used but the node has no matrix key 'sizes'", "recipe.yaml:6",
        hint="did you mean 'size'"),
    Bad("matrix-not-a-list", "name: x\nnodes:\n  - {name: a, stage: synth, matrix: {size: 3}}\n",
        r"matrix\.size: Input should be a valid list", "recipe.yaml:3"),
    # ------------------------------------------------------------------ variables, extends, --set
    Bad("env-var-not-set", "name: x\nnodes:\n  - {name: a, stage: synth, params: {text: '${TRTFLOW_TEST_UNSET}'}}\n",
        r"environment variable 'TRTFLOW_TEST_UNSET' is not set", "recipe.yaml:3",
        hint=r"export TRTFLOW_TEST_UNSET=\.\.\."),
    Bad("extends-missing", "extends: base.yaml\nname: x\nnodes:\n" + SYNTH, r"base recipe 'base.yaml' not found",
        "recipe.yaml:1"),
    Bad("extends-cycle", "extends: base.yaml\nname: x\nnodes:\n" + SYNTH,
        r"recipes extend each other in a cycle", "base.yaml:1",
        files={"base.yaml": "extends: recipe.yaml\nname: base\nnodes:\n" + SYNTH}),
    Bad("extends-not-a-string", "extends: [a.yaml]\nname: x\nnodes:\n" + SYNTH,
        r"'extends' must be a path to a base recipe", "recipe.yaml:1"),
    Bad("extends-outside-the-project", "extends: ../outside/base.yaml\nname: x\nnodes:\n" + SYNTH,
        r"extends: path '\.\./outside/base\.yaml' resolves to .*outside/base\.yaml, outside the allowed directories",
        "recipe.yaml:1:10", hint="TRTFLOW_ALLOWED_PATHS"),
    Bad("extends-absolute-path", "extends: /etc/passwd\nname: x\nnodes:\n" + SYNTH,
        r"extends: path '/etc/passwd' resolves to /etc/passwd, outside the allowed directories", "recipe.yaml:1:10"),
    Bad("extends-symlink-out", "extends: base.yaml\nname: x\nnodes:\n" + SYNTH,
        r"extends: path 'base\.yaml' resolves to .*outside/base\.yaml, outside the allowed directories",
        "recipe.yaml:1:10", symlinks={"project/base.yaml": "outside/base.yaml"}),
    Bad("extends-base-is-hostile", "extends: base.yaml\nname: x\nnodes:\n" + SYNTH,
        r"values nested more than 64 levels deep", "base.yaml:1:",
        files={"base.yaml": "name: " + "[" * 100 + "]" * 100 + "\n"}),
    Bad("extends-base-nested-beyond-the-parser", "extends: base.yaml\nname: x\nnodes:\n" + SYNTH,
        r"values nested more than 64 levels deep", "base.yaml:2:",
        files={"base.yaml": "name: b\nnodes: " + "[" * 200_000 + "]" * 200_000 + "\n"}),
    Bad("extends-base-key-too-long", "extends: base.yaml\nname: x\nnodes:\n" + SYNTH,
        r"a mapping key of 1500 characters", "base.yaml:1:1", files={"base.yaml": "k" * 1500 + ": 1\n"}),
    Bad("set-without-equals", "name: x\nnodes:\n" + SYNTH, r"expected KEY.PATH=VALUE", "--set nodes.a.params.size",
        overrides=("nodes.a.params.size",)),
    Bad("set-unknown-node", "name: x\nnodes:\n" + SYNTH, r"no node named 'b'", "--set nodes.b.params.size=3",
        overrides=("nodes.b.params.size=3",)),
    Bad("set-wrong-type", "name: x\nnodes:\n" + SYNTH, r"params\.size: Input should be a valid integer",
        "--set nodes.a.params.size=big", overrides=("nodes.a.params.size=big",)),
    Bad("set-alias-bomb", "name: x\nnodes:\n" + SYNTH, r"aliases and merge keys expand to more than 100000 values",
        "--set nodes.a.params.text=", overrides=("nodes.a.params.text=" + SET_ALIAS_BOMB,)),
    Bad("set-nested-too-deep", "name: x\nnodes:\n" + SYNTH, r"values nested more than 64 levels deep",
        "--set nodes.a.params.text=[[[", overrides=("nodes.a.params.text=" + "[" * 5000,)),
    Bad("set-nested-closed-too-deep", "name: x\nnodes:\n" + SYNTH, r"values nested more than 64 levels deep",
        "--set nodes.a.params.text=[[[", overrides=("nodes.a.params.text=" + "[" * 5000 + "]" * 5000,)),
    Bad("set-nested-json-too-deep", "name: x\nnodes:\n" + SYNTH, r"values nested more than 64 levels deep",
        '--set nodes.a.params.text={"a": {"a"', overrides=("nodes.a.params.text=" + '{"a": ' * 5000 + "1"
                                                              + "}" * 5000,)),
    Bad("set-nested-beyond-the-key-path", "name: x\nnodes:\n" + SYNTH, r"values nested more than 64 levels deep",
        "--set nodes.a.params.text=", overrides=("nodes.a.params.text=" + "[" * 62 + "]" * 62,)),
    Bad("set-key-too-long-in-the-value", "name: x\nnodes:\n" + SYNTH, r"a mapping key of 2000 characters",
        "--set nodes.a.params.text={kkk", overrides=("nodes.a.params.text={" + "k" * 2000 + ": 1}",)),
    Bad("set-key-too-long-in-the-path", "name: x\nnodes:\n" + SYNTH, r"a mapping key of 2000 characters",
        "--set nodes.a.params.kkk", overrides=("nodes.a.params." + "k" * 2000 + "=1",)),
    Bad("set-huge-scalar", "name: x\nnodes:\n" + SYNTH, r"a value of 1048577 characters",
        "--set nodes.a.params.text=aaa", overrides=("nodes.a.params.text=" + "a" * ((1 << 20) + 1),)),
    Bad("set-key-path-too-deep", "name: x\nnodes:\n" + SYNTH, r"a key path of 100 parts \(at most 64\)",
        "--set " + "a." * 99, overrides=("a." * 99 + "a=1",)),
    Bad("set-integer-of-5000-digits", "name: x\nnodes:\n" + SYNTH, r"an integer of 5000 digits",
        "--set nodes.a.params.size=", overrides=("nodes.a.params.size=" + "9" * 5000,)),
    Bad("set-not-utf8", "name: x\nnodes:\n" + SYNTH, r"not valid UTF-8 text", "--set nodes.a.params.text=\\xff",
        overrides=("nodes.a.params.text=\udcff",)),  # how a non-UTF-8 byte in argv reaches Python
    Bad("env-var-not-utf8", "name: x\nnodes:\n  - {name: a, stage: synth, params: {text: '${TRTFLOW_TEST_BYTES}'}}\n",
        r"environment variable 'TRTFLOW_TEST_BYTES' is not valid UTF-8 text", "recipe.yaml:3:",
        env={"TRTFLOW_TEST_BYTES": "\udcff"}),
    Bad("recipe-name-too-long", "name: " + "n" * 10_000 + "\nnodes:\n" + SYNTH,
        r"name: String should have at most 128 characters \(got 'nnnn.*\.\.\. \(10002 characters\)\)", "recipe.yaml:1"),
    Bad("matrix-variant-name-too-long", "name: x\nnodes:\n  - name: " + "a" * 128 + "\n    stage: synth\n"
        "    params: {text: '${{ matrix.p }}${{ matrix.q }}${{ matrix.r }}'}\n"
        f"    matrix: {{p: [{'b' * 60}], q: [{'c' * 60}], r: [{'d' * 60}]}}\n",
        r"nodes\[0\]\.matrix: matrix variant name a+\.\.\. is 251 characters \(at most 200\)", "recipe.yaml:6:"),
    Bad("set-python-tag", "name: x\nnodes:\n" + SYNTH, r"YAML tag .*python/name:os.system' is not allowed",
        "--set nodes.a.params.text=", overrides=("nodes.a.params.text=!!python/name:os.system ''",)),
    # ------------------------------------------------------------------ files a recipe points at
    Bad("model-file-missing", "name: x\nnodes:\n  - {name: e, stage: export, params: {model: missing.onnx}}\n",
        r"node 'e': file 'missing.onnx' not found", "recipe.yaml:3"),
    Bad("model-path-escapes-with-dotdot",
        "name: x\nnodes:\n  - {name: e, stage: export, params: {model: ../../../../../../etc/x.onnx}}\n",
        r"node 'e': path '\.\./.*x\.onnx' resolves to /etc/x\.onnx, outside the allowed directories",
        "recipe.yaml:3", hint="TRTFLOW_ALLOWED_PATHS"),
    Bad("model-absolute-path-outside", "name: x\nnodes:\n  - {name: e, stage: export, params: {model: /etc/x.onnx}}\n",
        r"node 'e': path '/etc/x\.onnx' resolves to /etc/x\.onnx, outside the allowed directories",
        "recipe.yaml:3"),
    Bad("model-symlink-out", "name: x\nnodes:\n  - {name: e, stage: export, params: {model: link.onnx}}\n",
        r"node 'e': path 'link\.onnx' resolves to .*outside/secret\.onnx, outside the allowed directories",
        "recipe.yaml:3", symlinks={"project/link.onnx": "outside/secret.onnx"}),
    Bad("model-dangling-symlink", "name: x\nnodes:\n  - {name: e, stage: export, params: {model: gone.onnx}}\n",
        r"node 'e': file 'gone\.onnx' not found", "recipe.yaml:3", symlinks={"project/gone.onnx": "project/nowhere"}),
    Bad("model-is-a-named-pipe", "name: x\nnodes:\n  - {name: e, stage: export, params: {model: pipe.onnx}}\n",
        r"node 'e': 'pipe\.onnx' is not a regular file or directory", "recipe.yaml:3", fifos=("pipe.onnx",)),
    Bad("model-missing-behind-stale-upstream", r("""
        name: x
        nodes:
          - {name: e, stage: export, params: {model: m.onnx}}
          - {name: q, stage: quantize, params: {mode: int8, calibration_data: {path: calib.npz}}}
        """), r"node 'q': file 'calib\.npz' not found", "recipe.yaml:4", files={"m.onnx": "never read"}),
    Bad("data-folder-holding-a-pipe", "name: x\nnodes:\n  - {name: e, stage: export, params: {model: m.onnx}}\n"
        "  - {name: q, stage: quantize, inputs: {model: e}, params: {mode: int8, calibration_data: {path: data}}}\n",
        r"node 'q': \S+/data/p in folder \S+/data is not a regular file", "recipe.yaml:4",
        files={"m.onnx": "x", "data/a.npz": "x"}, fifos=("data/p",)),  # hashing the folder blocked on it
    Bad("data-folder-linking-out", "name: x\nnodes:\n  - {name: e, stage: export, params: {model: m.onnx}}\n"
        "  - {name: q, stage: quantize, inputs: {model: e}, params: {mode: int8, calibration_data: {path: data}}}\n",
        r"node 'q': \S+/data/leak in folder \S+/data links to \S+/outside/secret.onnx, outside the allowed",
        "recipe.yaml:4", files={"m.onnx": "x", "data/a.npz": "x"},
        symlinks={"project/data/leak": "outside/secret.onnx"}),
    Bad("data-path-is-the-project", "name: x\nnodes:\n  - {name: e, stage: export, params: {model: m.onnx}}\n"
        "  - {name: q, stage: quantize, inputs: {model: e}, params: {mode: int8, calibration_data: {path: .}}}\n",
        r"node 'q': path '\.' resolves to \S+/project, a folder that holds the recipe itself", "recipe.yaml:4",
        files={"m.onnx": "x"}),
    Bad("python-model-file-missing",
        "name: x\nnodes:\n  - name: e\n    stage: export\n    params:\n      model: python:nope.py:build\n"
        "      inputs: {input: {shape: [1, 16]}}\n",
        r"node 'e': file 'nope\.py' not found", "recipe.yaml:3"),
]


def _materialise(case: Bad, tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir(parents=True)
    (project / "pyproject.toml").write_text("")  # the project root bounds where recipe paths may point
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.onnx").write_text("secret")
    recipe = project / "recipe.yaml"
    for name, content in {"recipe.yaml": case.recipe, **case.files}.items():
        path = project / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    for fifo in case.fifos:
        os.mkfifo(project / fifo)
    for link, target in case.symlinks.items():
        (tmp_path / link).symlink_to(tmp_path / target)
    return recipe


@pytest.fixture(scope="module")
def plugin_paths_module(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    paths = write_plugin_distribution(tmp_path_factory.mktemp("plugins"))
    activate_in_process(paths)
    return paths


def _assert_matches(case: Bad, error: RecipeError) -> None:
    text = str(error)
    assert re.search(case.message, error.message, re.S), f"{case.id}: message does not match:\n{text}"
    if case.where.startswith("node:"):
        assert f"'{case.where[5:]}'" in error.message, f"{case.id}: node not named:\n{text}"
    else:
        assert case.where in error.message, f"{case.id}: location {case.where!r} not in:\n{text}"
    if case.hint:
        assert error.hint and re.search(case.hint, error.hint), f"{case.id}: hint {error.hint!r}"
    assert "Traceback" not in text
    assert len(text) < 10_000, f"{case.id}: a message of {len(text)} characters"  # never the whole input again
    assert error.exit_code == EXIT_USAGE


def _refuse(case: Bad, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = _materialise(case, tmp_path)
    monkeypatch.chdir(recipe.parent)
    monkeypatch.delenv("TRTFLOW_ALLOWED_PATHS", raising=False)
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(RecipeError) as info:
        pipeline = load_pipeline(recipe, case.overrides)
        make_plan(pipeline.graph, Store(tmp_path / "store"), Environment.from_env(), pipeline.loaded.directory)
    _assert_matches(case, info.value)


@pytest.mark.parametrize("case", CATALOGUE, ids=lambda c: c.id)
def test_bad_recipe_is_a_recipe_error_naming_the_place(case: Bad, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       plugin_paths_module: list[str]) -> None:
    _refuse(case, tmp_path, monkeypatch)


# ---------------------------------------------------------------------------------------------------------
# The same errors whichever YAML parser reads the text. libyaml (PyYAML's CSafeLoader) and PyYAML's pure-Python
# parser (used where libyaml is missing) differ in their wording and in the limits they enforce themselves
# (libyaml 0.2.6+ refuses nesting beyond 1000 levels before the composer sees the 65th; both refuse a key of
# more than 1024 characters): the user sees trtflow's message and the same file and line from either.

YAML_LAYER = [c for c in CATALOGUE if c.id.startswith(("yaml-", "set-", "extends-base", "empty-", "comments-",
                                                       "not-a-", "recipe-name", "env-"))]
PARSERS = ["libyaml", "python"]


def _use_parser(parser: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if parser == "libyaml" and not hasattr(yaml, "CSafeLoader"):
        pytest.skip("PyYAML was built without libyaml here")
    monkeypatch.setattr(yaml_data, "_LOADER", yaml.CSafeLoader if parser == "libyaml" else yaml.SafeLoader)


@pytest.mark.parametrize("case", YAML_LAYER, ids=lambda c: c.id)
def test_the_pure_python_parser_gives_the_same_errors(case: Bad, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      plugin_paths_module: list[str]) -> None:
    _use_parser("python", monkeypatch)
    _refuse(case, tmp_path, monkeypatch)


HOSTILE = ["yaml-billion-laughs", "yaml-merge-key-bomb", "yaml-nested-200000-deep", "yaml-nested-unclosed-on-one-line",
           "yaml-key-too-long", "set-alias-bomb", "set-nested-json-too-deep", "extends-base-nested-beyond-the-parser"]


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("case_id", HOSTILE)
def test_hostile_yaml_is_refused_in_bounded_memory_and_time(case_id: str, parser: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            plugin_paths_module: list[str]) -> None:
    """Refused before it grows, by either parser: memory a few times the text (at most 1 MiB here), never the
    expansion (gigabytes); CPU time of this process (not wall time: a busy machine does not count)."""
    _use_parser(parser, monkeypatch)
    case = next(c for c in CATALOGUE if c.id == case_id)
    tracemalloc.start()
    cpu = time.process_time()
    try:
        _refuse(case, tmp_path, monkeypatch)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"{case_id}: {peak / 2**20:.0f} MiB"
    assert time.process_time() - cpu < 120, "seconds of CPU: the input grew before it was refused"


@pytest.mark.parametrize("cwd", ["project", "tmp", "/"])
def test_paths_are_judged_by_the_recipes_project_never_the_working_directory(
        cwd: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plugin_paths_module: list[str]) -> None:
    """A recipe refused from its project is refused from anywhere (the working directory used to be allowed)."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.npz").write_text("secret")
    (tmp_path / "outside" / "evil.py").write_text("def build():\n    raise SystemExit('ran')\n")
    recipes = {
        "data": "  - {name: q, stage: quantize, inputs: {model: e},\n"
                "     params: {mode: int8, calibration_data: {path: ../../outside/secret.npz}}}\n",
        "code": f"  - name: p\n    stage: export\n    params:\n      model: python:{tmp_path}/outside/evil.py:build\n"
                "      inputs: {input: {shape: [1, 16]}}\n",
    }
    monkeypatch.delenv("TRTFLOW_ALLOWED_PATHS", raising=False)
    for what, node in recipes.items():
        recipe = _materialise(Bad(what, "name: x\nnodes:\n  - {name: e, stage: export, params: {model: m.onnx}}\n"
                                  + node, "", "", files={"m.onnx": "x"}), tmp_path / what)
        monkeypatch.chdir({"project": recipe.parent, "tmp": tmp_path, "/": Path("/")}[cwd])
        with pytest.raises(RecipeError, match=r"recipe.yaml:4:\d+: node '[qp]': path .* outside the allowed "
                           r"directories \(\S+/project\)"):
            pipeline = load_pipeline(recipe)
            make_plan(pipeline.graph, Store(tmp_path / "store"), Environment.from_env(), pipeline.loaded.directory)


def test_catalogue_is_large_and_unique() -> None:
    ids = [c.id for c in CATALOGUE]
    assert len(ids) == len(set(ids))
    assert len(ids) + len(CLI_CASES) + len(STAGE_CASES) >= 40


# ---------------------------------------------------------------------------------------------------------
# The same kind of errors through the real command line: message on stderr, no traceback, exit code.

CLI_CASES = [
    # (id, args after the recipe path, recipe text, expected stderr regex, exit code)
    ("cli-recipe-not-found", ["run", "nope.yaml"], None, r"error: recipe file not found: nope\.yaml", 2),
    ("cli-recipe-is-a-directory", ["plan", "."], None, r"error: cannot read recipe .*Is a directory", 2),
    ("cli-yaml-syntax", ["plan", "recipe.yaml"], "name: x\nnodes: [\n",
     r"error: recipe\.yaml:3:1: YAML syntax error", 2),
    ("cli-unknown-stage", ["run", "recipe.yaml"], "name: x\nnodes:\n  - {name: a, stage: biuld}\n",
     r"error: recipe\.yaml:3:\d+: nodes\[0\]\.stage: unknown stage 'biuld'.*\n.*hint: did you mean 'build'\?", 2),
    ("cli-cycle", ["run", "recipe.yaml"],
     "name: x\nnodes:\n  - {name: a, stage: synth, inputs: {source: b}}\n"
     "  - {name: b, stage: synth, inputs: {source: a}}\n", r"error: recipe\.yaml:3:\d+: inputs: the nodes form a cycle",
     2),
    ("cli-env-var-unset", ["run", "recipe.yaml"],
     "name: x\nnodes:\n  - {name: a, stage: synth, params: {text: '${TRTFLOW_TEST_UNSET}'}}\n",
     r"error: recipe\.yaml:3:\d+: environment variable 'TRTFLOW_TEST_UNSET' is not set", 2),
    ("cli-unknown-target", ["run", "recipe.yaml", "alpah"], "name: x\nnodes:\n  - {name: alpha, stage: synth}\n",
     r"error: no node named 'alpah' in recipe 'x'\n.*hint: did you mean 'alpha'\?", 2),
    ("cli-bad-option", ["run", "recipe.yaml", "--jobs", "-1"], "name: x\nnodes:\n  - {name: a, stage: synth}\n",
     r"Invalid value for '--jobs' / '-j'", 2),
    ("cli-show-unknown-node", ["show", "recipe.yaml", "alpah"], "name: x\nnodes:\n  - {name: alpha, stage: synth}\n",
     r"error: no node named 'alpah' in recipe 'x'\n.*hint: did you mean 'alpha'\?", 2),
]


@pytest.mark.parametrize(("case_id", "args", "recipe", "stderr", "code"), CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_bad_input_through_the_cli(case_id: str, args: list[str], recipe: str | None, stderr: str, code: int,
                                   tmp_path: Path, plugin_paths_module: list[str]) -> None:
    if recipe is not None:
        (tmp_path / "recipe.yaml").write_text(recipe)
    env = subprocess_env(plugin_paths_module)
    env.pop("TRTFLOW_TEST_UNSET", None)
    proc = subprocess.run([sys.executable, "-m", "trtflow.cli", *args, "--store", str(tmp_path / "store")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert re.search(stderr, proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr


# Limits through the real command line with either parser (the pure-Python one as where libyaml is missing).
LIMIT_CLI_CASES = [
    # (id, args, recipe text, stderr regex)
    ("nested-200000-deep", ["plan", "recipe.yaml"], "name: x\nnodes: " + "[" * 200_000 + "]" * 200_000 + "\n",
     r"error: recipe\.yaml:2:\d+: values nested more than 64 levels deep"),
    ("set-json-nested-5000-deep", ["plan", "recipe.yaml", "--set", "nodes.a.params.text=" + '{"a": ' * 5000 + "1"
                                   + "}" * 5000], "name: x\nnodes:\n" + SYNTH,
     r'error: --set nodes\.a\.params\.text=\{"a": .*\(\d+ characters\):1:\d+: values nested more than 64 levels'),
    ("key-too-long", ["plan", "recipe.yaml"], "name: x\n" + "k" * 1500 + ": 1\nnodes:\n" + SYNTH,
     r"error: recipe\.yaml:2:1: a mapping key of 1500 characters \(at most 1024\)"),
    ("control-character", ["plan", "recipe.yaml"], "name: x\x07\nnodes:\n" + SYNTH,
     r"error: recipe\.yaml:1:8: YAML error: character #x0007 is not allowed in YAML text"),
]
_WITHOUT_LIBYAML = ("import sys, yaml; del yaml.CSafeLoader; sys.argv[0] = 'trtflow'; "
                    "from trtflow.cli.main import main; main()")


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize(("case_id", "args", "recipe", "stderr"), LIMIT_CLI_CASES, ids=[c[0] for c in LIMIT_CLI_CASES])
def test_limits_through_the_cli_with_either_parser(case_id: str, args: list[str], recipe: str, stderr: str,
                                                   parser: str, tmp_path: Path, plugin_paths_module: list[str]) -> None:
    (tmp_path / "recipe.yaml").write_text(recipe)
    python = [sys.executable, "-m", "trtflow.cli"] if parser == "libyaml" else [sys.executable, "-c", _WITHOUT_LIBYAML]
    proc = subprocess.run([*python, *args, "--store", str(tmp_path / "store")], cwd=tmp_path,
                          env=subprocess_env(plugin_paths_module), capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr[-3000:]
    assert re.search(stderr, proc.stderr), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr


# ---------------------------------------------------------------------------------------------------------
# Errors only a stage can find, through the real CLI on tiny real models. The location is the node.

STAGE_RECIPE = """\
name: stages
profiles:
  wrong_input: {images: {min: [1, 16], opt: [2, 16], max: [4, 16]}}
  wrong_rank: {input: {min: [1, 16, 1], opt: [2, 16, 1], max: [4, 16, 1]}}
nodes:
  - {name: garbage, stage: export, params: {model: garbage.onnx}}
  - {name: truncated, stage: export, params: {model: truncated.onnx}}
  - {name: empty, stage: export, params: {model: empty.onnx}}
  - {name: good, stage: export, params: {model: mlp.onnx}}
  - name: pickled_checkpoint
    stage: export
    params:
      model: python:tiny_mlp.py:build
      checkpoint: evil.pt
      inputs: {input: {shape: [1, 16]}}
  - name: factory_raises
    stage: export
    params:
      model: python:tiny_mlp.py:broken
      inputs: {input: {shape: [1, 16]}}
  - {name: calib_wrong_name, stage: quantize, inputs: {model: good},
     params: {mode: int8, calibration_data: {path: calib_wrong_name.npz}}}
  - {name: calib_wrong_shape, stage: quantize, inputs: {model: good},
     params: {mode: int8, calibration_data: {path: calib_wrong_shape.npz}}}
  - {name: calib_wrong_dtype, stage: quantize, inputs: {model: good},
     params: {mode: int8, calibration_data: {path: calib_wrong_dtype.npz}}}
  - {name: calib_pickled, stage: quantize, inputs: {model: good},
     params: {mode: int8, calibration_data: {path: calib_pickled.npy}}}
  - {name: profile_wrong_input, stage: build, params: {backend: tensorrt-rtx, profile: wrong_input},
     inputs: {model: good}}
  - {name: profile_wrong_rank, stage: build, params: {backend: tensorrt-rtx, profile: wrong_rank},
     inputs: {model: good}}
  - {name: backend_unavailable, stage: build, params: {backend: tensorrt}, inputs: {model: good}}
"""

EVIL_PICKLE = """\
import os


class Evil:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))
"""

# (node, status, message regex): status is what the CLI prints for the node ("failed" or "skipped").
STAGE_CASES = [
    ("garbage", "failed", r"'garbage\.onnx' is not a loadable ONNX file: .*\n\s+hint: re-export it"),
    ("truncated", "failed", r"'truncated\.onnx' is not a loadable ONNX file"),
    ("empty", "failed", r"(not a loadable ONNX file|does not pass onnx\.checker)"),
    ("pickled_checkpoint", "failed", r"cannot load checkpoint 'evil\.pt' with weights_only=True"),
    ("factory_raises", "failed", r"tiny_mlp\.py:broken' raised ValueError: this factory is broken"),
    ("calib_wrong_name", "failed", r"the data does not match the model inputs:\n\s+- input 'input' is missing"),
    ("calib_wrong_shape", "failed", r"input 'input': dimension 1 is 15, the model expects 16"),
    ("calib_wrong_dtype", "failed", r"input 'input'.*(dtype|float64|int32)"),
    ("calib_pickled", "failed", r"(pickle|allow_pickle)"),
    ("profile_wrong_input", "failed", r"profile 'wrong_input' gives shapes for 'images', which is not an input"),
    ("profile_wrong_rank", "failed", r"profile 'wrong_rank', input 'input': the profile has rank 3"),
    ("backend_unavailable", "skipped", r"backend 'tensorrt' is not installed here.*needs: .*pip install"),
]


@pytest.fixture(scope="module")
def stage_project(tiny_mlp_onnx: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import numpy as np
    import torch

    project = tmp_path_factory.mktemp("stage-errors")
    (project / "pyproject.toml").write_text("")
    (project / "recipe.yaml").write_text(STAGE_RECIPE)
    data = tiny_mlp_onnx.read_bytes()
    (project / "mlp.onnx").write_bytes(data)
    (project / "truncated.onnx").write_bytes(data[: len(data) // 2])
    (project / "garbage.onnx").write_bytes(b"\x00\xffnot an onnx file" * 40)
    (project / "empty.onnx").write_bytes(b"")
    mlp_source = (Path(__file__).resolve().parents[1] / "examples" / "models" / "tiny_mlp.py").read_text()
    broken = "\n\ndef broken():\n    raise ValueError('this factory is broken')\n"
    (project / "tiny_mlp.py").write_text(mlp_source + broken)
    (project / "evil.py").write_text(EVIL_PICKLE)
    sys.path.insert(0, str(project))
    try:
        import evil

        torch.save(evil.Evil(), project / "evil.pt")
    finally:
        sys.path.remove(str(project))
        sys.modules.pop("evil", None)
    np.savez(project / "calib_wrong_name.npz", images=np.zeros((8, 16), np.float32))
    np.savez(project / "calib_wrong_shape.npz", input=np.zeros((8, 15), np.float32))
    np.savez(project / "calib_wrong_dtype.npz", input=np.zeros((8, 16), np.int32))
    np.save(project / "calib_pickled.npy", np.array([{"input": 1}], dtype=object), allow_pickle=True)
    return project


@pytest.fixture(scope="module")
def stage_run(stage_project: Path, plugin_paths_module: list[str]) -> subprocess.CompletedProcess:
    env = subprocess_env(plugin_paths_module)
    return subprocess.run([sys.executable, "-m", "trtflow.cli", "run", "recipe.yaml", "--keep-going", "-j", "2",
                           "--store", str(stage_project / "store")], cwd=stage_project, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize(("node", "status", "message"), STAGE_CASES, ids=[c[0] for c in STAGE_CASES])
def test_stage_level_bad_input_fails_that_node_with_a_clear_message(node: str, status: str, message: str,
                                                                    stage_run: subprocess.CompletedProcess,
                                                                    stage_project: Path) -> None:
    out = stage_run.stdout
    assert stage_run.returncode == 1, out + stage_run.stderr
    assert "Traceback" not in stage_run.stderr and "internal error" not in out + stage_run.stderr
    block = re.search(rf"^[✗-] {re.escape(node)}\s+{status}: (.*?)(?=^[▶✓✗-] |^Failed|\Z)", out, re.M | re.S)
    assert block, f"no '{status}' line for node {node!r}:\n{out}"
    assert re.search(message, block.group(1), re.S), f"{node}: {block.group(1)}"
    if status == "failed":
        assert re.search(r"log:\s+\S+/" + re.escape(node) + r"\.log", block.group(1)), block.group(1)
    manifests = {m["node"] for _, m in Store(stage_project / "store").iter_manifests() if m}
    assert node not in manifests and "good" in manifests
    assert not (stage_project / "PWNED").exists(), "unpickling the checkpoint ran code"


@pytest.mark.slow
def test_unavailable_backend_with_require_gpu_exits_3(stage_project: Path, stage_run: subprocess.CompletedProcess,
                                                      plugin_paths_module: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "trtflow.cli", "run", "recipe.yaml", "backend_unavailable",
                           "--require-gpu", "--store", str(stage_project / "store")], cwd=stage_project,
                          env=subprocess_env(plugin_paths_module), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert re.search(r"backend_unavailable\s+failed: backend 'tensorrt' is not installed here.*--require-gpu",
                     proc.stdout), proc.stdout
