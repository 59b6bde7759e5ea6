"""Expand a recipe into concrete nodes: matrix fan-out, stage defaults, named profiles, param validation."""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from trtflow.errors import Location, RecipeError, did_you_mean
from trtflow.params import validated_params, written_out
from trtflow.recipe.load import LoadedRecipe, validation_error
from trtflow.recipe.schema import NodeSpec, Recipe

_MATRIX_REF = re.compile(r"\$\{\{\s*matrix\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_.]+")
MAX_NODES = 50_000  # concrete nodes of one recipe, matrix variants counted
MAX_VARIANT_NAME = 200  # a node name is a file name (NAME_MAX is 255 bytes on common filesystems)
_MAX_LABEL = 40


@dataclass
class ConcreteNode:
    """A node after matrix expansion, with validated parameters and unresolved input references."""

    name: str
    template: str
    stage: str
    params: dict[str, Any]  # validated and JSON-ready, every default written (trtflow.params.written_out)
    params_model: Any
    input_refs: dict[str, list[str]]
    explicit_inputs: bool
    matrix: dict[str, Any]
    timeout: float | None
    index: int  # position of the template in the recipe
    location: Location | None
    description: str | None = None
    upstream: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # slot -> [(node, output)]
    resources: dict[str, Any] = field(default_factory=dict)  # the recipe's overrides of the stage's Resources


def expand(loaded: LoadedRecipe, stages: Any) -> list[ConcreteNode]:
    """Turn recipe nodes into concrete nodes. ``stages`` maps a name to a Stage (a mapping, or a function such as
    `trtflow.registry.get_stage`)."""
    stages_get = stages.__getitem__ if not callable(stages) else stages
    recipe = loaded.recipe
    _check_node_count(loaded)
    matrix_key_users = Counter(key for spec in recipe.nodes for key in spec.matrix)
    out: list[ConcreteNode] = []
    for index, spec in enumerate(recipe.nodes):
        if not spec.enabled:
            continue
        node_loc = loaded.location("nodes", index)
        try:
            stage = stages_get(spec.stage)
        except RecipeError as exc:
            raise RecipeError(exc.message, loaded.location("nodes", index, "stage"), f"nodes[{index}].stage",
                              hint=exc.hint) from None
        except KeyError:
            raise RecipeError(f"unknown stage {spec.stage!r}", loaded.location("nodes", index, "stage"),
                              f"nodes[{index}].stage") from None
        field_names = set(stage.params.model_fields)
        _check_matrix_keys(spec, field_names, matrix_key_users, loaded, index)
        for combo in _combinations(spec, loaded, index):
            name = _variant_name(spec.name, combo)
            if len(name) > MAX_VARIANT_NAME:
                raise RecipeError(f"matrix variant name {name[:60]}... is {len(name)} characters (at most "
                                  f"{MAX_VARIANT_NAME})", loaded.location("nodes", index, "matrix"),
                                  f"nodes[{index}].matrix", hint="use fewer matrix keys or a shorter node name")
            params = dict(recipe.defaults.get(spec.stage, {}))
            params.update(_substitute(spec.params, combo, loaded, ("nodes", index, "params")))
            for key, value in combo.items():
                if key in field_names and key not in spec.params:
                    params[key] = value
                elif key in field_names and params[key] != value:  # a value written beside the matrix: no winner
                    raise RecipeError(
                        f"node {spec.name!r}: params.{key} is {params[key]!r} but its matrix sets {key} to {value!r} "
                        f"for variant {name!r}; a written parameter would silently replace the matrix's value",
                        loaded.location("nodes", index, "params", key), f"nodes[{index}].params.{key}",
                        hint=f"remove params.{key} (the matrix sets it per variant), or write "
                        f"'${{{{ matrix.{key} }}}}'")
            params = _resolve_profiles(params, recipe, loaded, index)
            from pydantic import ValidationError

            try:
                model = validated_params(stage.params, params)
            except ValidationError as exc:
                marks = _marks_with_defaults(loaded, index, spec.stage, spec.params)
                raise validation_error(exc, marks, ("nodes", index, "params"), stage.params,
                                       what=f"parameters of node {name!r}") from None
            _check_written_in_recipe(model, loaded, index, spec.stage, name)
            refs = {
                slot: [_node_reference(_substitute(r, combo, loaded, ("nodes", index, "inputs", slot)), r, loaded,
                                       ("nodes", index, "inputs", slot))
                       for r in (ref if isinstance(ref, list) else [ref])]
                for slot, ref in spec.inputs.items()
            }
            # what the node carries, and the model a worker reads from it (what the stage runs on, every process)
            written, read = written_out(spec.stage, model)
            out.append(ConcreteNode(
                name=name, template=spec.name, stage=spec.stage,
                params=written, params_model=read,
                input_refs=refs, explicit_inputs=bool(spec.inputs), matrix=combo,
                timeout=spec.timeout, index=index, location=node_loc, description=spec.description,
                resources=spec.resources.model_dump(exclude_none=True) if spec.resources else {},
            ))
    return out


def _check_written_in_recipe(model: Any, loaded: LoadedRecipe, index: int, stage: str, name: str) -> None:
    """Refuse a grant of trust (a field marked ``written_in_recipe``, e.g. export's ``trust_code``) that comes from
    ``--set`` rather than from a recipe file: trusting a model's code is reviewed with the recipe, not typed."""
    for field_name, info in type(model).model_fields.items():
        extra = info.json_schema_extra
        if not (isinstance(extra, dict) and extra.get("written_in_recipe") and getattr(model, field_name)):
            continue
        for path in (("nodes", index, "params", field_name), ("nodes", index, "matrix", field_name),
                     ("defaults", stage, field_name)):
            place = loaded.marks.by_path.get(path)
            if place is not None and str(place[0]).startswith("--set"):
                raise RecipeError(
                    f"node {name!r}: {field_name} may be turned on only in a recipe file, not with --set",
                    Location(*place), field_name,
                    hint=f"write `{field_name}: true` in the node's params, where it is reviewed with the recipe")


def _marks_with_defaults(loaded: LoadedRecipe, index: int, stage: str, own: dict[str, Any]) -> Any:
    """Marks where parameters inherited from `defaults:` point at the defaults section, not at the node."""
    from trtflow.recipe.load import Marks

    by_path = dict(loaded.marks.by_path)
    for (*rest,), location in loaded.marks.subtree(("defaults", stage)).items():
        if rest and rest[0] not in own:
            at_node = ("nodes", index, "params", *rest)
            by_path[at_node] = location
    return Marks(by_path)


def _combinations(spec: NodeSpec, loaded: LoadedRecipe, index: int) -> list[dict[str, Any]]:
    if not spec.matrix:
        return [{}]
    for key, values in spec.matrix.items():
        if not values:
            raise RecipeError(f"matrix key {key!r} has no values", loaded.location("nodes", index, "matrix", key),
                              f"nodes[{index}].matrix.{key}")
        for position, value in enumerate(values):
            if isinstance(value, float) and not math.isfinite(value):
                raise RecipeError(
                    f"matrix value {value!r} of key {key!r} is not a finite number: a matrix value names a node "
                    "variant and is matched against other nodes' values, and NaN equals nothing (and inf, -inf "
                    "give one name)", loaded.location("nodes", index, "matrix", key, position),
                    f"nodes[{index}].matrix.{key}[{position}]",
                    hint="quote it if you mean the text, or use a finite number")
    keys = list(spec.matrix)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(spec.matrix[k] for k in keys))]


def _check_node_count(loaded: LoadedRecipe) -> None:
    """Refuse a recipe whose matrices fan out to more nodes than can be planned, before expanding any."""
    total = 0
    for index, spec in enumerate(loaded.recipe.nodes):
        if spec.enabled:
            total += math.prod(len(values) for values in spec.matrix.values())
        if total > MAX_NODES:
            raise RecipeError(
                f"the recipe expands to more than {MAX_NODES} nodes (matrix variants counted)",
                loaded.location("nodes", index, "matrix") if spec.matrix else loaded.location("nodes", index),
                f"nodes[{index}].matrix" if spec.matrix else None,
                hint="fewer matrix values per node, or split the recipe",
            )


def _check_matrix_keys(spec: NodeSpec, field_names: set[str], matrix_key_users: Counter[str],
                       loaded: LoadedRecipe, index: int) -> None:
    """A matrix key must set a parameter, be used as ${{ matrix.KEY }}, or pair variants with another node."""
    used: set[str] = set()

    def collect(value: Any) -> None:
        if isinstance(value, dict):
            for v in value.values():
                collect(v)
        elif isinstance(value, list):
            for v in value:
                collect(v)
        elif isinstance(value, str):
            used.update(_MATRIX_REF.findall(value))

    if not spec.matrix:
        return
    collect([spec.params, spec.inputs])
    for key in spec.matrix:
        if key in field_names or key in used or matrix_key_users[key] > 1:  # > 1: a node other than this one
            continue
        elsewhere = [k for k, users in matrix_key_users.items() if users > 1 or k not in spec.matrix]
        raise RecipeError(
            f"matrix key {key!r} is not a parameter of stage {spec.stage!r}, is not used as "
            f"${{{{ matrix.{key} }}}}, and no other node has it: every variant would be the same",
            loaded.marks.find_key(("nodes", index, "matrix", key)), f"nodes[{index}].matrix.{key}",
            hint=did_you_mean(key, sorted(field_names | set(elsewhere)))
            or f"parameters of {spec.stage}: {', '.join(sorted(field_names))}",
        )


def _label(value: Any, position: int) -> str:
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        value = value["name"]
    if isinstance(value, (str, int, float, bool)):
        text = _LABEL_UNSAFE.sub("_", str(value).lower()).strip("_")
        if len(text) > _MAX_LABEL:  # a long value: its start, and a digest that keeps variants apart
            digest = hashlib.sha256(str(value).encode("utf-8", "surrogatepass")).hexdigest()
            text = f"{text[:_MAX_LABEL - 9]}_{digest[:8]}"
        return text or str(position)
    return str(position)


def _variant_name(template: str, combo: dict[str, Any]) -> str:
    if not combo:
        return template
    return "-".join([template, *(_label(v, i) for i, v in enumerate(combo.values()))])


def _substitute(value: Any, combo: dict[str, Any], loaded: LoadedRecipe, path: tuple) -> Any:
    if isinstance(value, dict):
        return {k: _substitute(v, combo, loaded, (*path, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, combo, loaded, (*path, i)) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${{" not in value:
        return value

    def lookup(key: str) -> Any:
        if key not in combo:
            raise RecipeError(
                f"${{{{ matrix.{key} }}}} used but the node has no matrix key {key!r}",
                loaded.location(*path), ".".join(str(p) for p in path),
                hint=did_you_mean(key, list(combo)) or f"matrix keys: {', '.join(combo) or 'none'}",
            )
        return combo[key]

    whole = _MATRIX_REF.fullmatch(value.strip())
    if whole:
        return lookup(whole.group(1))
    return _MATRIX_REF.sub(lambda m: str(lookup(m.group(1))), value)


def _node_reference(value: Any, written: Any, loaded: LoadedRecipe, path: tuple) -> str:
    """An input reference after matrix substitution: a node name (a matrix value used whole must be one)."""
    if isinstance(value, str):
        return value
    raise RecipeError(f"input {path[-1]!r}: {written!r} gives {value!r} ({type(value).__name__}), not the name of "
                      "a node", loaded.location(*path), ".".join(str(p) for p in path),
                      hint="an input names a node (or node.output); give the matrix key node names as values")


def _resolve_profiles(params: dict[str, Any], recipe: Recipe, loaded: LoadedRecipe, index: int) -> dict[str, Any]:
    def resolve(name: Any, path: tuple) -> Any:
        if not isinstance(name, str):
            return name
        if name not in recipe.profiles:
            raise RecipeError(
                f"unknown profile {name!r}", loaded.location(*path), ".".join(str(p) for p in path),
                hint=did_you_mean(name, list(recipe.profiles))
                or f"profiles defined in the recipe: {', '.join(recipe.profiles) or 'none'}",
            )
        shapes = {inp: rng.model_dump() for inp, rng in recipe.profiles[name].items()}
        return {"name": name, "shapes": shapes}

    out = dict(params)
    base = ("nodes", index, "params")
    if "profile" in out:
        out["profile"] = resolve(out["profile"], (*base, "profile"))
    if isinstance(out.get("profiles"), list):
        out["profiles"] = [resolve(p, (*base, "profiles", i)) for i, p in enumerate(out["profiles"])]
    return out
