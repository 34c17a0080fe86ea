"""Validation of a request's ``constraint`` field at admission, before it reaches the engine."""

from __future__ import annotations

import json
from typing import Any

from podium.errors import InvalidArgument

XARGS_KEY = "podium_constraint"
"""Key in ``SamplingParams.extra_args`` (``vllm_xargs``) carrying the normalized spec JSON."""


def admit_constraint(spec: object, *, min_tokens: object = None, xargs: object = None,
                     xargs_field: str = "vllm_xargs",
                     also_constrained_by: str | None = None) -> dict[str, Any]:
    """Admit a request's ``constraint``: validate it and the sampling settings it must live
    with, and return the request's extra arguments (``xargs``) with the constraint added.

    Both the OpenAI path (``vllm_xargs``) and the KServe path (``SamplingParams.extra_args``)
    admit constraints here, so they refuse the same requests with the same messages.
    ``also_constrained_by`` names a field of the request that constrains the answer too (vLLM's
    structured outputs): refused, as together they may allow nothing.
    """
    normalized = validate_constraint(spec)
    check_sampling(min_tokens=min_tokens)
    if also_constrained_by is not None:
        # measured: a choice of "a" with json_object masked every token, and vLLM failed the
        # request with a 500 ("grammar rejected tokens")
        raise InvalidArgument(
            f"constraint cannot be combined with {also_constrained_by}: both would constrain "
            "the same answer, and together they may allow no token at all; send one of them",
            param="constraint")
    if xargs is None:
        xargs = {}
    if not isinstance(xargs, dict):
        raise InvalidArgument(f"{xargs_field} must be an object, got {type(xargs).__name__}",
                              param=xargs_field)
    return {**xargs, **to_vllm_xargs(normalized)}


def validate_constraint(spec: object) -> dict[str, Any]:
    """Check a request's ``constraint`` and return it normalized (JSON-able).

    Raises :class:`~podium.errors.InvalidArgument` naming the problem (``param`` points at
    the offending field, e.g. ``constraint.min``): unknown type, empty candidate set,
    ``min > max``, invalid regex, wrong types.
    """
    from podium.constraints.spec.registry import constraint_type, constraint_type_names

    if not isinstance(spec, dict):
        raise InvalidArgument(
            f"constraint must be an object with a 'type', got {type(spec).__name__}",
            param="constraint")
    name = spec.get("type")
    if not isinstance(name, str):
        raise InvalidArgument("constraint.type is required (a string)", param="constraint.type")
    ct = constraint_type(name)
    if ct is None:
        raise InvalidArgument(
            f"unknown constraint type {name!r}; known: {', '.join(constraint_type_names())}",
            param="constraint.type")
    try:
        normalized = ct.validate(dict(spec))
    except ValueError as e:
        field = e.args[1] if len(e.args) > 1 and isinstance(e.args[1], str) else None
        raise InvalidArgument(f"constraint ({name}): {e.args[0]}",
                              param=f"constraint.{field}" if field else "constraint") from None
    normalized["type"] = name
    return normalized


def check_sampling(*, min_tokens: object = None) -> None:
    """Sampling settings a constraint cannot live with. A complete constraint allows only the
    end of text, which `min_tokens` forbids: every token would be masked."""
    if isinstance(min_tokens, int) and not isinstance(min_tokens, bool) and min_tokens > 0:
        raise InvalidArgument("min_tokens cannot be combined with a constraint: once the "
                              "constraint is complete only the end of text is allowed, which "
                              "min_tokens forbids; remove min_tokens", param="min_tokens")


def to_vllm_xargs(normalized: dict[str, Any]) -> dict[str, str]:
    """The ``vllm_xargs`` entry that carries a normalized constraint to the engine."""
    return {XARGS_KEY: json.dumps(normalized, ensure_ascii=False, separators=(",", ":"))}
