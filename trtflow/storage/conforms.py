"""Does a parsed JSON value conform to a declared type? The strict check `records` runs on every record it reads.

The declared types are TypedDicts (keys ``Required``/``NotRequired``, ``total``; keys a type does not declare pass),
``dict[str, X]``, ``list[X]``, ``X | Y``, ``Literal[...]``, ``Any``, ``str``, ``int``, ``float``, ``bool``, ``None``
and ``Annotated[X, annotated_types.Len(...)]``. The rules are pydantic's strict mode (a ``bool`` is no ``int``, an
``int`` is a ``float``, a string is never a number): pydantic's ``TypeAdapter(...).validate_python(value,
strict=True)`` is the reference this module replaces on the hot path (importing pydantic and building an adapter per
record kind costs every command, the no-op run included, a tenth of a second and more), and
``tests/reliability/test_conforms.py`` checks both give the same verdict on every record kind over generated values.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from functools import cache
from typing import Any, Literal, NotRequired, Required, Union, get_args, get_origin

from typing_extensions import is_typeddict

#: A check: the value -> None if it conforms, else (the path of keys and indexes to the first problem, what is wrong).
Check = Callable[[Any], "tuple[tuple[str | int, ...], str] | None"]


def problem(declared: Any, value: Any) -> tuple[tuple[str | int, ...], str] | None:
    """None if ``value`` conforms to ``declared``, else where (a path of keys and indexes) and what is wrong."""
    return _checker(declared)(value)


@cache
def _checker(declared: Any) -> Check:
    """The check of ``declared``, made once per type (TypedDicts' hints are resolved here, not at import)."""
    origin, args = get_origin(declared), get_args(declared)
    if declared is Any:
        return lambda value: None
    if declared is None or declared is type(None):
        return _is(lambda v: v is None, "not null")
    if declared is bool:
        return _is(lambda v: isinstance(v, bool), "not a boolean")
    if declared is int:
        return _is(lambda v: isinstance(v, int) and not isinstance(v, bool), "not an integer")
    if declared is float:
        return _is(lambda v: isinstance(v, int | float) and not isinstance(v, bool), "not a number")
    if declared is str:
        return _is(lambda v: isinstance(v, str), "not a string")
    if origin is typing.Annotated:
        return _annotated(args[0], args[1:])
    if origin is Literal:
        allowed = args
        return _is(lambda v: any(type(v) is type(a) and v == a for a in allowed), f"not one of {list(allowed)}")
    if origin is Union or origin is types.UnionType:
        members = [_checker(a) for a in args]
        return lambda value: _union(value, members)
    if origin is list or declared is list:
        item = _checker(args[0]) if args else _checker(Any)
        return lambda value: _items(value, item)
    if origin is dict or declared is dict:
        val = _checker(args[1]) if args else _checker(Any)
        return lambda value: _mapping(value, val)
    if is_typeddict(declared):
        return _typeddict(declared)
    raise TypeError(f"records cannot check the type {declared!r}")


def _union(value: Any, members: list[Check]) -> tuple[tuple[str | int, ...], str] | None:
    """None if a member takes ``value``; else the problem of the member that got furthest into it (the one meant)."""
    found = []
    for member in members:
        problem_ = member(value)
        if problem_ is None:
            return None
        found.append(problem_)
    return max(found, key=lambda p: len(p[0]))


def _is(test: Callable[[Any], bool], what: str) -> Check:
    return lambda value: None if test(value) else ((), what)


def _annotated(inner: Any, metadata: tuple[Any, ...]) -> Check:
    check = _checker(inner)
    low = max([getattr(m, "min_length", 0) or 0 for m in metadata], default=0)
    highs = [m.max_length for m in metadata if getattr(m, "max_length", None) is not None]
    high = min(highs) if highs else None

    def run(value: Any) -> tuple[tuple[str | int, ...], str] | None:
        found = check(value)
        if found is None and hasattr(value, "__len__") and not low <= len(value) <= (high or len(value)):
            return (), f"length {len(value)} not within {low}..{'' if high is None else high}"
        return found

    return run


def _items(value: Any, item: Check) -> tuple[tuple[str | int, ...], str] | None:
    if not isinstance(value, list):
        return (), "not a list"
    for index, entry in enumerate(value):
        found = item(entry)
        if found is not None:
            return (index, *found[0]), found[1]
    return None


def _mapping(value: Any, val: Check) -> tuple[tuple[str | int, ...], str] | None:
    if not isinstance(value, dict):
        return (), "not an object"
    for key, entry in value.items():
        if not isinstance(key, str):
            return (str(key),), "a key that is not a string"
        found = val(entry)
        if found is not None:
            return (key, *found[0]), found[1]
    return None


def _typeddict(declared: Any) -> Check:
    hints = typing.get_type_hints(declared, include_extras=True)
    fields: dict[str, Check] = {}
    required: set[str] = set()
    for name, hint in hints.items():
        origin = get_origin(hint)
        if origin is Required or (origin is not NotRequired and getattr(declared, "__total__", True)):
            required.add(name)
        while get_origin(hint) in (Required, NotRequired):
            hint = get_args(hint)[0]
        fields[name] = _checker(hint)

    def run(value: Any) -> tuple[tuple[str | int, ...], str] | None:
        if not isinstance(value, dict):
            return (), "not an object"
        for name in required:
            if name not in value:
                return (name,), "missing"
        for name, check in fields.items():
            if name in value:
                found = check(value[name])
                if found is not None:
                    return (name, *found[0]), found[1]
        return None

    return run
