"""Load a recipe: YAML with line marks, ${VAR} interpolation, `extends`, and --set overrides.

Every value keeps the file, line and column it came from, so any later error (schema, stage parameter,
reference) can point at it. YAML is composed with the safe loader and only plain data tags are
accepted: nothing in a recipe constructs objects or runs code.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trtflow.errors import Location, RecipeError, did_you_mean
from trtflow.recipe.schema import Recipe

Path_ = tuple[Any, ...]
KEY = "<key>"  # a path ending in KEY marks where the mapping key itself is written

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_ALLOWED_TAGS = {
    "tag:yaml.org,2002:map",
    "tag:yaml.org,2002:seq",
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
}
_MAX_VALUES = 200_000
_MAX_EXTENDS_DEPTH = 16
_ENV_PATTERN = re.compile(r"\$\$\{|\$\{(?!\{)([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass
class Marks:
    """Source locations of values in a loaded recipe, keyed by their path from the root."""

    by_path: dict[Path_, Location] = field(default_factory=dict)

    def find(self, path: Iterable[Any]) -> Location | None:
        """The location of ``path``, or of its nearest ancestor that has one."""
        key = tuple(path)
        while True:
            if key in self.by_path:
                return self.by_path[key]
            if not key:
                return None
            key = key[:-1]

    def find_key(self, path: Iterable[Any]) -> Location | None:
        """Where the mapping key that names ``path`` is written (for "unknown key" errors)."""
        key = tuple(path)
        return self.by_path.get((*key, KEY)) or self.find(key)

    def subtree(self, prefix: Path_) -> dict[Path_, Location]:
        n = len(prefix)
        return {p[n:]: loc for p, loc in self.by_path.items() if p[:n] == prefix}


@dataclass
class LoadedRecipe:
    recipe: Recipe
    path: Path
    marks: Marks

    @property
    def directory(self) -> Path:
        return self.path.parent

    def location(self, *path: Any) -> Location | None:
        return self.marks.find(path)


def _location(file: str, mark: Any) -> Location:
    return Location(file, mark.line + 1, mark.column + 1)


class _Converter:
    def __init__(self, file: str, loader: Any) -> None:
        self.file = file
        self.loader = loader
        self.marks: dict[Path_, Location] = {}
        self.count = 0
        self.merged: dict[int, int] = {}  # id of a mapping node -> how many of its pairs came from `<<:` merges

    def convert(self, node: yaml.Node, path: Path_) -> Any:
        self.count += 1
        if self.count > _MAX_VALUES:
            raise RecipeError(
                f"recipe expands to more than {_MAX_VALUES} values (too many aliases?)",
                _location(self.file, node.start_mark),
            )
        self.marks[path] = _location(self.file, node.start_mark)
        if node.tag not in _ALLOWED_TAGS:
            raise RecipeError(
                f"YAML tag {node.tag!r} is not allowed in a recipe; only plain data (maps, lists, strings, "
                "numbers, booleans, null) is accepted",
                _location(self.file, node.start_mark),
                hint="remove the tag; recipes never construct objects",
            )
        if isinstance(node, yaml.MappingNode):
            merged = self.merged.get(id(node))
            if merged is None:  # first visit (an alias visits the same node again, already flattened)
                own = sum(1 for key_node, _ in node.value if key_node.tag != "tag:yaml.org,2002:merge")
                self.loader.flatten_mapping(node)
                merged = self.merged[id(node)] = len(node.value) - own
            result: dict[Any, Any] = {}
            written_here: set[Any] = set()  # keys written in this mapping, not brought in by a `<<:` merge
            for index, (key_node, value_node) in enumerate(node.value):
                key = self.convert(key_node, (*path, KEY, KEY))
                if isinstance(key, (dict, list)):
                    raise RecipeError("a mapping key must be a plain value", _location(self.file, key_node.start_mark))
                if index >= merged:
                    if key in written_here:
                        raise RecipeError(
                            f"duplicate key {key!r}", _location(self.file, key_node.start_mark),
                            hint="each key may appear once in a mapping",
                        )
                    written_here.add(key)
                self.marks[(*path, key, KEY)] = _location(self.file, key_node.start_mark)
                result[key] = self.convert(value_node, (*path, key))
            self.marks.pop((*path, KEY, KEY), None)
            return result
        if isinstance(node, yaml.SequenceNode):
            return [self.convert(item, (*path, i)) for i, item in enumerate(node.value)]
        value = self.loader.construct_object(node, deep=True)
        if isinstance(value, str):
            value = self.interpolate(value, node)
        return value

    def interpolate(self, text: str, node: yaml.Node) -> str:
        if "$" not in text:
            return text

        def replace(match: re.Match[str]) -> str:
            if match.group(0) == "$${":
                return "${"
            name, default = match.group(1), match.group(2)
            value = os.environ.get(name)
            if value is None:
                if default is not None:
                    return default
                raise RecipeError(
                    f"environment variable {name!r} is not set",
                    _location(self.file, node.start_mark),
                    hint=f"export {name}=... before running, or write ${{{name}:-default}}",
                )
            return value

        return _ENV_PATTERN.sub(replace, text)


def parse_yaml(text: str, file: str) -> tuple[Any, Marks]:
    """Parse YAML text into plain data plus the location of every value."""
    loader = _LOADER(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            loc = _location(file, mark) if mark is not None else Location(file, 0, 0)
            problem = exc.problem or exc.context or "invalid YAML"
            lines = text.split("\n")
            line = lines[mark.line] if mark is not None and 0 <= mark.line < len(lines) else ""
            tab = mark is not None and 0 <= mark.column < len(line) and line[mark.column] == "\t"
            raise RecipeError(f"YAML syntax error: {problem}" + (" (a tab)" if tab else ""), loc,
                              hint="YAML indents with spaces, never tabs" if tab else None) from None
        except yaml.YAMLError as exc:
            raise RecipeError(f"YAML error: {exc}", Location(file, 0, 0)) from None
        if node is None:
            return None, Marks()
        converter = _Converter(file, loader)
        try:
            data = converter.convert(node, ())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            raise RecipeError(f"YAML error: {getattr(exc, 'problem', exc)}",
                              _location(file, mark) if mark else None) from None
        return data, Marks(converter.marks)
    finally:
        loader.dispose()


def _read_raw(path: Path, stack: tuple[Path, ...]) -> tuple[dict[str, Any], Marks]:
    display = _display(path)
    if len(stack) > _MAX_EXTENDS_DEPTH:
        raise RecipeError(f"recipe 'extends' chain deeper than {_MAX_EXTENDS_DEPTH}", Location(display, 0, 0))
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(f"recipe file not found: {display}", hint="check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(f"cannot read recipe {display}: {exc}") from None
    data, marks = parse_yaml(text, display)
    if data is None:
        raise RecipeError("the recipe is empty", Location(display, 1, 1),
                          hint="a recipe needs at least 'name' and 'nodes'")
    if not isinstance(data, dict):
        raise RecipeError("a recipe must be a mapping with 'name' and 'nodes'", marks.find(()))
    base_ref = data.get("extends")
    if base_ref is None:
        return data, marks
    if not isinstance(base_ref, str):
        raise RecipeError("'extends' must be a path to a base recipe", marks.find(("extends",)), "extends")
    base_path = (path.parent / base_ref).resolve()
    if base_path in stack:
        chain = " -> ".join(_display(p) for p in (*stack, base_path))
        raise RecipeError(f"recipes extend each other in a cycle: {chain}", marks.find(("extends",)), "extends")
    if not base_path.exists():
        raise RecipeError(f"base recipe {base_ref!r} not found (looked at {_display(base_path)})",
                          marks.find(("extends",)), "extends")
    base, base_marks = _read_raw(base_path, (*stack, base_path))
    data = dict(data)
    data.pop("extends")
    return merge_recipes(base, base_marks, data, marks)


def merge_recipes(base: dict, base_marks: Marks, child: dict, child_marks: Marks) -> tuple[dict, Marks]:
    """Child settings win; mappings merge deeply; nodes merge by name (child keys override base keys)."""
    merged = copy.deepcopy(base)
    marks = dict(base_marks.by_path)
    for key, value in child.items():
        if key == "nodes" and isinstance(value, list) and isinstance(merged.get("nodes"), list):
            merged["nodes"], marks = _merge_nodes(merged["nodes"], marks, value, child_marks)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
            marks.update({(key, *p): loc for p, loc in child_marks.subtree((key,)).items()})
        else:
            merged[key] = copy.deepcopy(value)
            marks = {p: loc for p, loc in marks.items() if not p or p[0] != key}
            marks.update({(key, *p): loc for p, loc in child_marks.subtree((key,)).items()})
    return merged, Marks(marks)


def _deep_merge(base: dict, child: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _merge_nodes(base_nodes: list, marks: dict, child_nodes: list, child_marks: Marks) -> tuple[list, dict]:
    index_by_name = {n.get("name"): i for i, n in enumerate(base_nodes) if isinstance(n, dict)}
    result = list(base_nodes)
    for ci, node in enumerate(child_nodes):
        sub = child_marks.subtree(("nodes", ci))
        name = node.get("name") if isinstance(node, dict) else None
        if name in index_by_name:
            i = index_by_name[name]
            result[i] = _deep_merge(result[i], node)
        else:
            i = len(result)
            result.append(copy.deepcopy(node))
        marks.update({("nodes", i, *p): loc for p, loc in sub.items()})
    return result, marks


def apply_overrides(data: dict, marks: Marks, overrides: Sequence[str]) -> None:
    """Apply ``--set a.b=value`` overrides in place. ``nodes.NAME.params.x`` addresses a node by name."""
    for expr in overrides:
        where = Location(f"--set {expr}", 0, 0)
        if "=" not in expr:
            raise RecipeError("expected KEY.PATH=VALUE", where, hint="e.g. --set nodes.export.params.opset=18")
        dotted, raw = expr.split("=", 1)
        parts = [p for p in dotted.strip().split(".") if p]
        if not parts:
            raise RecipeError("empty key", where)
        try:
            value = yaml.load(raw, Loader=_LOADER) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        target: Any = data
        path: list[Any] = []
        for i, part in enumerate(parts[:-1]):
            if isinstance(target, list):
                match = [j for j, n in enumerate(target) if isinstance(n, dict) and n.get("name") == part]
                if not match:
                    names = [n.get("name") for n in target if isinstance(n, dict)]
                    raise RecipeError(f"no node named {part!r}", where, ".".join(parts[: i + 1]),
                                      hint=did_you_mean(part, [n for n in names if isinstance(n, str)]))
                path.append(match[0])
                target = target[match[0]]
            elif isinstance(target, dict):
                path.append(part)
                target = target.setdefault(part, {})
            else:
                raise RecipeError(f"cannot set inside a {type(target).__name__}", where, ".".join(parts[: i + 1]))
        if not isinstance(target, dict):
            raise RecipeError(f"cannot set a key inside a {type(target).__name__}", where, dotted)
        target[parts[-1]] = value
        marks.by_path[(*path, parts[-1])] = where


def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> LoadedRecipe:
    """Read, merge, interpolate and validate a recipe file (stage parameters are checked in expand)."""
    from pydantic import ValidationError

    path = Path(path).resolve()
    data, marks = _read_raw(path, (path,))
    apply_overrides(data, marks, overrides)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, marks, (), Recipe) from None
    return LoadedRecipe(recipe=recipe, path=path, marks=marks)


def validation_error(exc: Any, marks: Marks, prefix: Path_, model: Any = None,
                     what: str = "recipe") -> RecipeError:
    """Turn a pydantic ValidationError into one RecipeError listing every problem with its location."""
    lines = []
    first_loc: Location | None = None
    for err in exc.errors():
        loc = tuple(err.get("loc", ()))
        full = (*prefix, *loc)
        location = marks.find_key(full) if err.get("type") == "extra_forbidden" else marks.find(full)
        first_loc = first_loc or location
        field_name = ".".join(str(p) for p in full) or "(root)"
        message = err.get("msg", "invalid value")
        if err.get("type") == "extra_forbidden" and loc:
            known = _known_fields(model, loc[:-1])
            suggestion = did_you_mean(str(loc[-1]), known) if known else None
            message = f"unknown key {loc[-1]!r}" + (f"; {suggestion}" if suggestion else "")
            if known:
                message += f" (allowed: {', '.join(sorted(known))})"
        elif err.get("type") == "missing":
            message = f"required field {loc[-1]!r} is missing" if loc else message
        elif "input" in err and not isinstance(err["input"], (dict, list)):
            message = f"{message} (got {err['input']!r})"
        lines.append(f"{location or '<recipe>'}: {field_name}: {message}")
    text = lines[0] if len(lines) == 1 else f"{len(lines)} problems in the {what}:\n  " + "\n  ".join(lines)
    error = RecipeError(text)
    error.location = first_loc
    return error


def _known_fields(model: Any, loc: Path_) -> list[str]:
    """Field names of the sub-model at ``loc`` (best effort, for suggestions)."""
    from pydantic import BaseModel

    current = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        if isinstance(current, type) and issubclass(current, BaseModel):
            info = current.model_fields.get(str(part))
            if info is None:
                return []
            current = _inner_model(info.annotation)
        else:
            return []
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _inner_model(annotation: Any) -> Any:
    from typing import get_args

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _display(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)
