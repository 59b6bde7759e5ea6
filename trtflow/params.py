"""A node's parameters written out and read back: the one place that validates them.

A node's parameters travel written out in full (`written_out`: every default a value): in the plan, the job a
worker or a Ray task receives, the journal and `trtflow show`. So what a stage does may depend only on the
values, never on which fields a recipe wrote (pydantic's fields-set is "every field" once they were written out,
and a node's key, made from the written-out form, could not tell the two apart): a default that means "decide for
me" is None, written out as null (benchmark's ``torch_cuda_graphs``, prompts' ``count``/``length``/``seed``).
`validated_params` is what every place that validates a node's parameters calls (recipe expansion, the worker, the
Ray executor); tests/test_set_means_set.py fails on code that reads the fields-set (``model_fields_set``,
``exclude_unset``, ...) anywhere in trtflow/ or stages/, and on a re-validation that goes around this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from trtflow.errors import InternalError


class _Params(Protocol):
    """A pydantic model's class as a stage library may name it (a `typing.Protocol` of its params)."""

    @classmethod
    def model_validate(cls, obj: Any) -> Any: ...


P = TypeVar("P", bound=_Params)


def validated_params(params_type: type[P], params: Mapping[str, Any]) -> P:
    """A stage's parameters (``params_type``, its `trtflow.stage.StageParams`) from their written-out form."""
    return params_type.model_validate(params)


M = TypeVar("M", bound=BaseModel)


def written_out(stage: str, model: M) -> tuple[dict[str, Any], M]:
    """``model`` as a node carries it (JSON-ready, every default written) and the parameters a node's process reads
    from that (`validated_params`), checked to be the same. A stage whose parameters do not read back as written is
    a bug of the stage, refused when the recipe is planned, naming the field: its nodes would otherwise run, in a
    worker, on other parameters than the recipe's."""
    dump = model.model_dump(mode="json")
    try:
        read = validated_params(type(model), dump)
        again = read.model_dump(mode="json")
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        raise InternalError(f"stage {stage!r}: its parameters, written out, are refused when read back ({where}: "
                            f"{first.get('msg')}); a default that means 'decide for me' must be None, not a value "
                            "that a validator reads as a choice") from None
    if again != dump:
        changed = sorted(key for key in dump.keys() | again.keys() if again.get(key) != dump.get(key))
        raise InternalError(f"stage {stage!r}: its parameters change when written out and read back "
                            f"({', '.join(changed)}): a stage's parameters must read back as written")
    return dump, read
