"""The published recipe JSON Schema: the recipe models plus every installed stage's parameters."""

from __future__ import annotations

from typing import Any

from trtflow.recipe.schema import Recipe
from trtflow.registry import get_stage, stage_names

SCHEMA_ID = "https://trtflow.dev/schema/recipe.schema.json"


def recipe_json_schema(builtin_only: bool = False) -> dict[str, Any]:
    """JSON Schema for recipe files; each node's ``params`` is checked against its stage's Params.

    ``builtin_only`` leaves out stages that plugins installed here add (for the schema trtflow ships).
    """
    schema = Recipe.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = SCHEMA_ID
    schema["title"] = "trtflow recipe"
    defs = schema.setdefault("$defs", {})
    branches = []
    stages = []
    for name in stage_names(builtin_only):
        stage = get_stage(name)
        stages.append(name)
        params_schema = stage.params.model_json_schema(ref_template="#/$defs/{model}")
        for def_name, definition in params_schema.pop("$defs", {}).items():
            defs.setdefault(def_name, definition)
        params_name = f"{name}_params"
        params_schema["description"] = f"Parameters of the {name!r} stage (version {stage.version}). " + (
            stage.description or "")
        defs[params_name] = _allow_names_for_profiles(params_schema)
        branches.append({
            "if": {"properties": {"stage": {"const": name}}, "required": ["stage"]},
            "then": {"properties": {"params": {"$ref": f"#/$defs/{params_name}"}}},
        })
    node = defs["NodeSpec"]
    node["properties"]["stage"]["examples"] = stages
    node["allOf"] = branches
    return schema


def _allow_names_for_profiles(params_schema: dict[str, Any]) -> dict[str, Any]:
    """`profile`/`profiles` may name a recipe-level profile instead of spelling it out."""
    props = params_schema.get("properties", {})
    if "profile" in props:
        props["profile"] = {"anyOf": [{"type": "string"}, props["profile"]],
                            "description": props["profile"].get("description", "")}
    if "profiles" in props:
        props["profiles"] = {"anyOf": [{"type": "array", "items": {"anyOf": [{"type": "string"}, {}]}},
                                       props["profiles"]],
                             "description": props["profiles"].get("description", "")}
    return params_schema
