"""Load a recipe: YAML with line marks, ${VAR} interpolation, `extends`, and --set overrides.

Every value keeps the file, line and column it came from, so any later error (schema, stage parameter,
reference) can point at it. YAML is composed by `yaml_data` into plain data only (nothing in a recipe
constructs objects or runs code), within limits counted before anything is expanded. The recipe file, its
`extends` bases and its --set values share one budget of values.
"""

from __future__ import annotations

import copy
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtflow import redact
from trtflow.errors import Location, RecipeError, TrtflowError, did_you_mean
from trtflow.fsutil import MAX_RECIPE_BYTES, allowed_roots_for, resolve_user_path
from trtflow.recipe.schema import Recipe
from trtflow.recipe.yaml_data import KEY, Budget, Path_, Place, YamlSyntaxError, compose, key_too_long
from trtflow.settings import refused_in_recipe
from trtflow.userfiles import read_file

__all__ = ["KEY", "LoadedRecipe", "Marks", "apply_overrides", "load_recipe", "parse_yaml", "validation_error"]

_MAX_EXTENDS_DEPTH = 16
_MAX_LISTED_PROBLEMS = 20
_SHOWN_SET_CHARS = 240  # of a --set argument named in an error (a value may be a megabyte long)
_ENV_PATTERN = re.compile(r"\$\$\{|\$\{(?!\{)([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass
class Marks:
    """Source locations of values in a loaded recipe: (file, line, column) keyed by their path from the root."""

    by_path: dict[Path_, Place] = field(default_factory=dict)

    def find(self, path: Iterable[Any]) -> Location | None:
        """The location of ``path``, or of its nearest ancestor that has one."""
        key = tuple(path)
        while True:
            if key in self.by_path:
                return Location(*self.by_path[key])
            if not key:
                return None
            key = key[:-1]

    def find_key(self, path: Iterable[Any]) -> Location | None:
        """Where the mapping key that names ``path`` is written (for "unknown key" errors)."""
        key = (*path, KEY)
        return Location(*self.by_path[key]) if key in self.by_path else self.find(key[:-1])

    def subtree(self, prefix: Path_) -> dict[Path_, Place]:
        n = len(prefix)
        return {p[n:]: loc for p, loc in self.by_path.items() if p[:n] == prefix}

    def children(self, prefix: Path_) -> dict[Any, dict[Path_, Place]]:
        """The marks under each child of ``prefix``, by child (one pass: `subtree` per child is quadratic)."""
        n = len(prefix)
        out: dict[Any, dict[Path_, Place]] = {}
        for p, loc in self.by_path.items():
            if len(p) > n and p[:n] == prefix:
                out.setdefault(p[n], {})[p[n + 1:]] = loc
        return out


@dataclass
class LoadedRecipe:
    recipe: Recipe
    path: Path
    marks: Marks
    sources: dict[Path, str] = field(default_factory=dict)  # every recipe file read (extends too) -> its text
    # each `extends` as written (after ${VAR}), the folder it is relative to, and the file it resolved to
    extends: list[tuple[str, Path, Path]] = field(default_factory=list)

    @property
    def directory(self) -> Path:
        return self.path.parent

    def location(self, *path: Any) -> Location | None:
        return self.marks.find(path)


def interpolate(text: str, where: Place) -> str:
    """Expand ``${VAR}`` and ``${VAR:-default}`` from the environment; ``$${`` stands for a literal ``${``."""
    if "$" not in text:
        return text

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        name, default = match.group(1), match.group(2)
        refused = refused_in_recipe(name)
        if refused is not None:
            raise RecipeError(refused, Location(*where),
                              hint=f"remove ${{{name}}} from the recipe: trtflow reads its signing key itself")
        value = os.environ.get(name)
        if value is None:
            if default is not None:
                return default
            raise RecipeError(f"environment variable {name!r} is not set", Location(*where),
                              hint=f"export {name}=... before running, or write ${{{name}:-default}}")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8 reach os.environ as lone surrogates
            raise RecipeError(f"environment variable {name!r} is not valid UTF-8 text", Location(*where)) from None
        redact.note(name, value)  # never printed: it may be a secret
        return value

    return _ENV_PATTERN.sub(replace, text)


def parse_yaml(text: str, file: str, budget: Budget | None = None) -> tuple[Any, Marks]:
    """Parse recipe YAML text into plain data (environment variables expanded) plus every value's location."""
    data, marks = compose(text, file, budget, on_string=interpolate)
    return data, Marks(marks)


def _read_text(path: Path, display: str) -> str:
    """The text of a recipe file, refusing what is not a regular file of reasonable size before reading it."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise RecipeError(f"recipe file not found: {display}", hint="check the path") from None
    except OSError as exc:
        raise RecipeError(f"cannot read recipe {display}: {exc}") from None
    if not stat.S_ISREG(info.st_mode) and not stat.S_ISDIR(info.st_mode):
        raise RecipeError(f"cannot read recipe {display}: not a regular file", hint="point at the YAML file")
    if info.st_size > MAX_RECIPE_BYTES:
        raise RecipeError(f"recipe {display} is {info.st_size} bytes, more than the {MAX_RECIPE_BYTES} a recipe "
                          "may have", hint="split it into several recipes")
    try:
        return read_file(path, MAX_RECIPE_BYTES).decode("utf-8")  # a regular file only, bounded
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(f"cannot read recipe {display}: {exc}") from None


def _read_raw(path: Path, stack: tuple[Path, ...], roots: list[Path], budget: Budget,
              sources: dict[Path, str], extends: list[tuple[str, Path, Path]]) -> tuple[dict, Marks]:
    display = _display(path)
    if len(stack) > _MAX_EXTENDS_DEPTH:
        raise RecipeError(f"recipe 'extends' chain deeper than {_MAX_EXTENDS_DEPTH}", Location(display, 0, 0))
    sources[path] = _read_text(path, display)
    data, marks = parse_yaml(sources[path], display, budget)
    if data is None:
        raise RecipeError("the recipe is empty", Location(display, 1, 1),
                          hint="a recipe needs at least 'name' and 'nodes'")
    if not isinstance(data, dict):
        raise RecipeError("a recipe must be a mapping with 'name' and 'nodes'", marks.find(()))
    base_ref = data.get("extends")
    if base_ref is None:
        return data, marks
    where = marks.find(("extends",))
    if not isinstance(base_ref, str) or not base_ref:
        raise RecipeError("'extends' must be a path to a base recipe", where, "extends")
    try:
        base_path = resolve_user_path(base_ref, path.parent, roots)
    except TrtflowError as exc:
        raise RecipeError(exc.message, where, "extends", hint=exc.hint) from None
    if base_path in stack:
        chain = " -> ".join(_display(p) for p in (*stack, base_path))
        raise RecipeError(f"recipes extend each other in a cycle: {chain}", where, "extends")
    if not base_path.exists():
        raise RecipeError(f"base recipe {base_ref!r} not found (looked at {_display(base_path)})", where, "extends")
    extends.append((base_ref, path.parent, base_path))
    base, base_marks = _read_raw(base_path, (*stack, base_path), roots, budget, sources, extends)
    data = dict(data)
    data.pop("extends")
    return merge_recipes(base, base_marks, data, marks)


def merge_recipes(base: dict, base_marks: Marks, child: dict, child_marks: Marks) -> tuple[dict, Marks]:
    """Child settings win; mappings merge deeply; nodes merge by name (child keys override base keys)."""
    merged = copy.deepcopy(base)
    marks = dict(base_marks.by_path)
    child_by_key = child_marks.children(())
    for key, value in child.items():
        own = child_by_key.get(key, {})
        if key == "nodes" and isinstance(value, list) and isinstance(merged.get("nodes"), list):
            merged["nodes"], marks = _merge_nodes(merged["nodes"], marks, value, Marks(own))
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
            marks.update({(key, *p): loc for p, loc in own.items()})
        else:
            merged[key] = copy.deepcopy(value)
            marks = {p: loc for p, loc in marks.items() if not p or p[0] != key}
            marks.update({(key, *p): loc for p, loc in own.items()})
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
    """Merge the child's nodes (``child_marks`` relative to its ``nodes`` list) into the base's by name."""
    index_by_name = {n.get("name"): i for i, n in enumerate(base_nodes) if isinstance(n, dict)}
    by_node = child_marks.children(())
    result = list(base_nodes)
    for ci, node in enumerate(child_nodes):
        name = node.get("name") if isinstance(node, dict) else None
        if name in index_by_name:
            i = index_by_name[name]
            result[i] = _deep_merge(result[i], node)
        else:
            i = len(result)
            result.append(copy.deepcopy(node))
        marks.update({("nodes", i, *p): loc for p, loc in by_node.get(ci, {}).items()})
    return result, marks


def apply_overrides(data: dict, marks: Marks, overrides: Sequence[str], budget: Budget | None = None) -> None:
    """Apply ``--set a.b=value`` overrides in place. ``nodes.NAME.params.x`` addresses a node by name.

    A value is YAML, read by the same guarded parser as the recipe (a value that is not valid YAML is taken
    as text); ``${VAR}`` is not expanded there (the shell has done that).
    """
    budget = budget or Budget()
    for expr in overrides:
        try:
            expr.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8 reach Python's argv as lone surrogates
            shown = expr.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            raise RecipeError("not valid UTF-8 text", Location(f"--set {shown}", 0, 0)) from None
        where = Location(f"--set {_short(expr, limit=_SHOWN_SET_CHARS)}", 0, 0)
        if "=" not in expr:
            raise RecipeError("expected KEY.PATH=VALUE", where, hint="e.g. --set nodes.export.params.opset=18")
        dotted, raw = expr.split("=", 1)
        parts = [p for p in dotted.strip().split(".") if p]
        if not parts:
            raise RecipeError("empty key", where)
        if len(parts) > budget.limits.max_depth:
            raise RecipeError(f"a key path of {len(parts)} parts (at most {budget.limits.max_depth})", where)
        longest = max(parts, key=len)
        if len(longest) > budget.limits.max_key_chars:
            raise key_too_long(len(longest), budget.limits.max_key_chars, where)
        value: Any = ""
        value_marks: dict[Path_, Place] = {}
        if raw.strip():
            try:
                value, value_marks = compose(raw, where.file, budget, depth=len(parts))
            except YamlSyntaxError:
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
        prefix = (*path, parts[-1])
        n = len(prefix)
        marks.by_path = {p: loc for p, loc in marks.by_path.items() if p[:n] != prefix}
        marks.by_path.update({(*prefix, *p): loc for p, loc in value_marks.items()})
        marks.by_path[prefix] = (where.file, where.line, where.column)


def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> LoadedRecipe:
    """Read, merge, interpolate and validate a recipe file (stage parameters are checked in expand)."""
    from pydantic import ValidationError

    path = Path(path).resolve()
    budget = Budget()
    sources: dict[Path, str] = {}
    extends: list[tuple[str, Path, Path]] = []
    data, marks = _read_raw(path, (path,), allowed_roots_for(path.parent), budget, sources, extends)
    apply_overrides(data, marks, overrides, budget)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, marks, (), Recipe) from None
    return LoadedRecipe(recipe=recipe, path=path, marks=marks, sources=sources, extends=extends)


def validation_error(exc: Any, marks: Marks, prefix: Path_, model: Any = None,
                     what: str = "recipe") -> RecipeError:
    """Turn a pydantic ValidationError into one RecipeError listing every problem with its location."""
    lines = []
    first_loc: Location | None = None
    errors = exc.errors()
    for err in errors[:_MAX_LISTED_PROBLEMS]:
        loc = tuple(err.get("loc", ()))
        full = (*prefix, *loc)
        location = marks.find_key(full) if err.get("type") == "extra_forbidden" else marks.find(full)
        first_loc = first_loc or location
        field_name = ".".join(_short(p) for p in full) or "(root)"
        message = err.get("msg", "invalid value")
        if err.get("type") == "extra_forbidden" and loc:
            known = _known_fields(model, loc[:-1])
            suggestion = did_you_mean(str(loc[-1]), known) if known else None
            message = f"unknown key {_short(loc[-1], repr)}" + (f"; {suggestion}" if suggestion else "")
            if known:
                message += f" (allowed: {', '.join(known)})"
        elif err.get("type") == "missing":
            message = f"required field {loc[-1]!r} is missing" if loc else message
        elif "input" in err and not isinstance(err["input"], (dict, list)):
            message = f"{message} (got {_short(err['input'], repr)})"
        lines.append(f"{location or '<recipe>'}: {field_name}: {message}")
    if len(errors) > len(lines):
        lines.append(f"... and {len(errors) - len(lines)} more")
    text = lines[0] if len(lines) == 1 else f"{len(errors)} problems in the {what}:\n  " + "\n  ".join(lines)
    error = RecipeError(text)
    error.location = first_loc
    return error


def _short(value: Any, show: Any = str, limit: int = 120) -> str:
    """``show(value)``, cut to ``limit`` characters (a recipe value may be a megabyte long)."""
    text = show(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _known_fields(model: Any, loc: Path_) -> list[str]:
    """Field names of the sub-model(s) that ``loc`` leads to within ``model`` (best effort, for suggestions)."""
    models = _models_at(model, loc) if model is not None else []
    return sorted({name for m in models for name in m.model_fields})


def _models_at(annotation: Any, loc: Path_) -> list[Any]:
    """The pydantic models a value at ``loc`` inside a value of type ``annotation`` can be.

    Follows model fields, dict values (a loc part is the key), list items (an index) and every arm of a union
    (pydantic may put the arm's name in the loc: it is skipped).
    """
    from typing import Annotated, Union, get_args, get_origin

    from pydantic import BaseModel

    origin = get_origin(annotation)
    if origin is Annotated:
        return _models_at(get_args(annotation)[0], loc)
    if origin is Union or type(annotation).__name__ == "UnionType":
        arms = get_args(annotation)
        found = [m for arm in arms for m in _models_at(arm, loc)]
        if not found and loc and isinstance(loc[0], str):
            found = [m for arm in arms for m in _models_at(arm, loc[1:])]
        return list(dict.fromkeys(found))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if not loc:
            return [annotation]
        info = annotation.model_fields.get(str(loc[0]))
        return _models_at(info.annotation, loc[1:]) if info is not None else []
    if not loc:
        return []
    args = get_args(annotation)
    if origin is dict and len(args) == 2:
        return _models_at(args[1], loc[1:])
    if origin in (list, tuple, set, frozenset) and args and isinstance(loc[0], int):
        return _models_at(args[0], loc[1:])
    return []


def _display(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)
