"""Command-line flags generated from a process config's fields, and the one way a bad value is
refused.

A config (`ServerConfig`, `UpConfig`, `GatewayConfig`) is a pydantic model whose fields carry
their bounds and one-line doc; a field that is a flag says so with `Flag` metadata:

    http_port: Annotated[int, Field(ge=0, le=65535), Flag("--http-port")] = 8000
    \"\"\"Gateway HTTP port.\"\"\"

`add_flags` adds one argparse argument per such field (type, default, choices, help from the
field), `flag_values` reads them back by field name, and a config deriving from `ProcessConfig`
refuses a bad value on construction with an `InvalidArgument` naming the flag, the value and the
bound (`--http-port 70000: Input should be less than or equal to 65535`). A field that no flag of
its own sets (a nested group with its own flags, a value from the environment) carries `NotAFlag`
with the reason, so every field is accounted for.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError, model_validator
from pydantic.fields import FieldInfo

from podium.errors import InvalidArgument


@dataclass(frozen=True)
class Flag:
    """A config field set by one command-line flag."""

    name: str
    """`--http-port`; a name without dashes is a positional argument (`packages`)."""
    metavar: str | None = None
    """Shown in --help in place of the type."""
    help: str | None = None
    """Help when the field's doc reads wrongly on the command line (default: the doc)."""
    parse: Callable[[Any], Any] | None = None
    """Turns the flag's value into the field's (seconds into a `LoopConfig`, ...)."""
    default: Any = None
    """The flag's default when `parse` is given (the field's default is then parsed from it)."""
    nargs: str | None = None
    """For a positional list: `*`."""
    type: Any = None
    """What the flag parses when `parse` makes the field's value (`float` seconds)."""
    env: Callable[[], Any] | None = None
    """Reads the flag's default from the environment (a function of `podium.env`); for a
    repeated flag, the one entry used when the flag is not given."""


@dataclass(frozen=True)
class NotAFlag:
    """A config field no flag of its own sets, and why (`reason`)."""

    reason: str
    shown_as: str | None = None
    """The flag that sets it, named in a refusal (`--api-key` for `api_keys`)."""


def flag_of(info: FieldInfo) -> Flag | None:
    """The field's `Flag`, if it has one."""
    return next((m for m in info.metadata if isinstance(m, Flag)), None)


def not_a_flag(info: FieldInfo) -> NotAFlag | None:
    """The field's `NotAFlag`, if it has one."""
    return next((m for m in info.metadata if isinstance(m, NotAFlag)), None)


def add_flags(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """One argument per `Flag` field of `model`, its value stored under the field's name."""
    for name, info in model.model_fields.items():
        flag = flag_of(info)
        if flag is not None:
            _add(parser, name, info, flag)


def flag_values(model: type[BaseModel], args: argparse.Namespace) -> dict[str, Any]:
    """The `Flag` fields of `model` as parsed into `args`, by field name."""
    values = {}
    for name, info in model.model_fields.items():
        flag = flag_of(info)
        if flag is not None:
            value = getattr(args, name)
            if value is None and flag.env is not None and _kind(info.annotation)[1]:
                fallback = flag.env()
                value = [fallback] if fallback else []
            values[name] = flag.parse(value) if flag.parse is not None else value
    return values


def flag_name(model: type[BaseModel], field: str) -> str:
    """What a user calls `field` of `model`: its flag, else the field's own name."""
    info = model.model_fields.get(field)
    if info is None:
        return field
    flag, other = flag_of(info), not_a_flag(info)
    return flag.name if flag is not None else (other and other.shown_as) or field


class ProcessConfig(BaseModel):
    """Base of a process's config: a bad value is an `InvalidArgument` naming its flag, the
    value given and the bound it breaks."""

    @model_validator(mode="wrap")
    @classmethod
    def _refuse_naming_the_flag(cls, data: Any, handler: Callable[[Any], Any]) -> Any:
        try:
            return handler(data)
        except ValidationError as exc:
            raise refusal(cls, exc) from None


def refusal(model: type[BaseModel], exc: ValidationError) -> InvalidArgument:
    """The first error of `exc` as `--flag VALUE: what is wrong` (the bound it breaks)."""
    error = exc.errors()[0]
    field = str(error["loc"][0]) if error["loc"] else ""
    name = flag_name(model, field) if field else model.__name__
    value = error.get("input")
    shown = value if isinstance(value, int | float | Path) and not isinstance(value, bool) \
        else repr(value)
    return InvalidArgument(f"{name} {shown}: {error['msg']}", param=name)


def _add(parser: argparse.ArgumentParser, name: str, info: FieldInfo, flag: Flag) -> None:
    kind, repeated = (flag.type, False) if flag.type is not None else _kind(info.annotation)
    default = flag.default if flag.parse is not None else info.get_default(
        call_default_factory=True)
    if flag.env is not None and not repeated:
        default = flag.env() or default
    help_text = (flag.help or info.description or "").replace("%", "%%")
    if default not in (None, [], (), False, "") and flag.env is None:  # never show a secret
        help_text += " (default %(default)s)"
    kwargs: dict[str, Any] = {"help": help_text}
    if flag.metavar:
        kwargs["metavar"] = flag.metavar
    if not flag.name.startswith("-"):  # positional: a list of paths
        parser.add_argument(name, nargs=flag.nargs or "*", type=kind, **kwargs)
        return
    kwargs["dest"] = name
    if kind is bool:
        parser.add_argument(flag.name, action="store_true", **kwargs)
        return
    if typing.get_origin(kind) is Literal:
        kwargs["choices"] = list(typing.get_args(kind))
    else:
        kwargs["type"] = kind
    if repeated:  # with `env`, None until a flag is given: the environment's value is a
        # fallback (flag_values), never one more entry
        parser.add_argument(flag.name, action="append",
                            default=None if flag.env else list(default or []), **kwargs)
    else:
        parser.add_argument(flag.name, default=default, **kwargs)


def _kind(annotation: Any) -> tuple[Any, bool]:
    """The scalar type a flag parses and whether it repeats (a list or tuple field)."""
    annotation = _strip(annotation)
    if typing.get_origin(annotation) in (types.UnionType, typing.Union):
        annotation = _strip(next(a for a in typing.get_args(annotation) if a is not type(None)))
    if typing.get_origin(annotation) in (list, tuple):
        return _strip(typing.get_args(annotation)[0]), True
    return annotation, False


def _strip(annotation: Any) -> Any:
    """`Annotated[X, ...]` -> X (FilePath is `Annotated[Path, ...]`)."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation
