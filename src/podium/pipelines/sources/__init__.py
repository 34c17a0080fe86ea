"""Feature sources: where `features` (and `candidates`) steps read rows by key.

Built in: `sql` (a table through SQLAlchemy: SQLite or PostgreSQL) and `feast` (a Feast
online store through Feast's SDK, an optional extra). Further sources are plugins: a
distribution registers a factory `(settings: dict, root: Path) -> FeatureSource` under the
`podium.feature_sources` entry point group; the entry point's name is the `type` a step uses.
"""

from __future__ import annotations

import abc
import importlib
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from podium.errors import PackageError

ENTRY_POINT_GROUP = "podium.feature_sources"
_BUILT_IN = {
    "sql": "podium.pipelines.sources.sql:SqlSource",
    "feast": "podium.pipelines.sources.feast:FeastSource",
}


class FeatureSource(abc.ABC):
    """Rows by key. Implementations may block: the step calls them in a worker thread, unless
    `inline` says a read is known to be fast (a local SQLite file): then it runs on the event
    loop, saving the thread hop, until a few of its reads were slow."""

    inline: bool = False
    """Whether reads run on the event loop (see `podium.pipelines.steps.features.read_source`,
    which turns it off for good after a few slow reads)."""
    slow_reads: int = 0
    """Inline reads that were slow so far."""

    def open(self, columns: list[str]) -> None:
        """At load: connect and check that `columns` exist (a PackageError names what not)."""
        return None

    @abc.abstractmethod
    def fetch(self, keys: list[Any], columns: list[str]) -> dict[Any, dict[str, Any]]:
        """The rows of the keys it has (missing keys are simply absent)."""

    def candidates(self, key: Any, column: str, limit: int) -> list[Any]:
        """`column` of every row whose key is `key` (a candidate set), at most `limit`."""
        raise PackageError(f"source {type(self).__name__} cannot list candidates; use a "
                           "`sql` source, a model or a function")

    def close(self) -> None:
        return None


def create_source(settings: dict[str, Any], root: Path) -> FeatureSource:
    """The source a step's `source` settings name, built (connections opened lazily)."""
    kind = settings.get("type")
    if not isinstance(kind, str):
        raise PackageError(f"source {settings!r}: field `type` is required ({known_types()})")
    options = {k: v for k, v in settings.items() if k != "type"}
    if kind in _BUILT_IN:
        module_name, class_name = _BUILT_IN[kind].split(":")
        factory = getattr(importlib.import_module(module_name), class_name)
    else:
        found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == kind]
        if not found:
            raise PackageError(f"source type {kind!r} is unknown; {known_types()}")
        factory = found[0].load()
    try:
        return factory(options, root)
    except TypeError as exc:
        raise PackageError(f"source {kind!r}: {exc}") from None


def known_types() -> str:
    plugins = sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
    return "known: " + ", ".join([*_BUILT_IN, *plugins])
