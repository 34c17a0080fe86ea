"""The `feast` feature source: a Feast feature repository's online store, through Feast's SDK
(an optional extra: `pip install podium[feast]`).

Settings: `repo_path` (the directory holding `feature_store.yaml`; relative: inside the
package), `feature_view`, `entity` (the join key the pipeline's keys are). Feast is imported
when the step is prepared, never by `import podium`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from podium.errors import PackageError
from podium.package.paths import DIRECTORY, named_path
from podium.pipelines.sources import FeatureSource

_FIELDS = {"repo_path", "feature_view", "entity"}


class FeastSource(FeatureSource):
    """Rows of one feature view by its entity's join key."""

    def __init__(self, options: dict[str, Any], root: Path) -> None:
        unknown = set(options) - _FIELDS
        if unknown:
            raise PackageError(f"feast source: unknown field(s) {sorted(unknown)}; fields: "
                               f"{', '.join(sorted(_FIELDS))}")
        for name in sorted(_FIELDS):
            if not isinstance(options.get(name), str) or not options[name]:
                raise PackageError(f"feast source: field `{name}` is required (a string)")
        repo = Path(options["repo_path"])
        self.repo = repo if repo.is_absolute() else named_path(
            root, options["repo_path"], "repo_path", (DIRECTORY,))
        self.view, self.entity = options["feature_view"], options["entity"]
        self._store: Any = None

    def open(self, columns: list[str]) -> None:
        try:
            from feast import FeatureStore
        except ImportError:
            raise PackageError("feast source: Feast is not installed; install the extra "
                               "(pip install 'podium[feast]')") from None
        try:
            self._store = FeatureStore(repo_path=str(self.repo))
            view = self._store.get_feature_view(self.view)
        except Exception as exc:  # Feast raises its own types for a missing repo or view
            raise PackageError(f"feast source: {self.repo}: feature view {self.view!r}: "
                               f"{type(exc).__name__}: {exc}") from None
        names = {feature.name for feature in view.features}
        missing = [c for c in columns if c not in names]
        if missing:
            raise PackageError(f"feast source: feature view {self.view!r} has no feature "
                               f"{missing[0]!r} (features: {', '.join(sorted(names))})")
        if columns:  # Feast builds its online read path on first use (seconds): pay it here
            with contextlib.suppress(Exception):  # a probe key of another type: no warm-up
                self._store.get_online_features(features=[f"{self.view}:{columns[0]}"],
                                                entity_rows=[{self.entity: ""}])

    def fetch(self, keys: list[Any], columns: list[str]) -> dict[Any, dict[str, Any]]:
        if self._store is None:
            self.open(columns)
        unique = list(dict.fromkeys(keys))
        answer = self._store.get_online_features(
            features=[f"{self.view}:{c}" for c in columns],
            entity_rows=[{self.entity: key} for key in unique]).to_dict()
        rows = {}
        for index, key in enumerate(unique):
            row = {c: answer[c][index] for c in columns}
            if any(value is not None for value in row.values()):
                rows[key] = row
        return rows
