"""`trtflow.storage.conforms` (the strict type check every record passes) agrees with pydantic's strict TypeAdapter,
the library it stands in for on the hot path, on every record kind `records.KINDS` declares: values drawn from each
declared type, then damaged at random places (another JSON value in place of a subtree, a key dropped, a bool for an
int, an int for a float), must get the same verdict from both. Budget: 80 examples a kind (about 10 s of CPU
for the 23 kinds)."""

from __future__ import annotations

import typing
from typing import Any, Literal, NotRequired, Required, Union, get_args, get_origin

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError
from typing_extensions import is_typeddict

from trtflow.storage import records
from trtflow.storage.conforms import problem

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                    max_leaves=6)


def _strategy(declared: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    """Values of ``declared``, each part replaced by arbitrary JSON now and then."""
    return st.one_of(_valid(declared, depth), JSON) if depth else _valid(declared, depth)


def _valid(declared: Any, depth: int) -> st.SearchStrategy[Any]:
    origin, args = get_origin(declared), get_args(declared)
    if declared is Any or depth > 4:
        return JSON
    if declared is None or declared is type(None):
        return st.none()
    if declared is bool:
        return st.booleans()
    if declared is int:
        return st.integers() | st.booleans()
    if declared is float:
        return st.floats(allow_nan=False) | st.integers()
    if declared is str:
        return st.text(max_size=4)
    if origin is typing.Annotated:
        return st.lists(_strategy(get_args(args[0])[0], depth + 1), max_size=3)
    if origin is Literal:
        return st.sampled_from(args) | JSON
    if origin is Union or str(origin) == "<class 'types.UnionType'>":
        return st.one_of([_strategy(a, depth + 1) for a in args])
    if origin is list or declared is list:
        return st.lists(_strategy(args[0] if args else Any, depth + 1), max_size=3)
    if origin is dict or declared is dict:
        return st.dictionaries(st.text(max_size=4), _strategy(args[1] if args else Any, depth + 1), max_size=3)
    if is_typeddict(declared):
        hints = typing.get_type_hints(declared, include_extras=True)
        required, optional = {}, {}
        for name, hint in hints.items():
            needed = get_origin(hint) is Required or (get_origin(hint) is not NotRequired and declared.__total__)
            while get_origin(hint) in (Required, NotRequired):
                hint = get_args(hint)[0]
            (required if needed else optional)[name] = _strategy(hint, depth + 1)
        return st.fixed_dictionaries(required, optional=optional)
    raise TypeError(declared)


def _pydantic_accepts(adapter: TypeAdapter[Any], value: Any) -> bool:
    try:
        adapter.validate_python(value, strict=True)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(records.KINDS))
def test_the_type_check_agrees_with_pydantic_on_every_record_kind(name: str) -> None:
    kind = records.KINDS[name]
    adapter = TypeAdapter(kind.declared)
    seen = {True: 0, False: 0}

    @settings(max_examples=80, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(_strategy(kind.declared))
    def agree(value: Any) -> None:
        ours = problem(kind.declared, value) is None
        seen[ours] += 1
        assert ours == _pydantic_accepts(adapter, value), (value, problem(kind.declared, value))

    agree()
    assert seen[True] and (seen[False] or kind.declared in (records.Json, dict[str, Any])), seen
