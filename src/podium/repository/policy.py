"""Which packaged versions of a model to serve (Triton's `version_policy`), and version order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from podium.errors import InvalidArgument, NotFound


def version_key(version: str) -> tuple[int, int | str]:
    """Sort key: numeric versions in numeric order, before named ones."""
    return (0, int(version)) if version.isdigit() else (1, version)


@dataclass(frozen=True)
class VersionPolicy:
    """Which of a model's packaged versions to serve (Triton's `version_policy`)."""

    latest: int | None = 1
    """Serve the newest N versions (the default: only the newest)."""
    specific: tuple[str, ...] = ()
    """Serve exactly these versions (overrides `latest`)."""
    all: bool = False
    """Serve every packaged version."""

    @classmethod
    def parse(cls, data: dict[str, Any] | None) -> VersionPolicy:
        """From Triton's JSON: {"latest": {"num_versions": 2}} | {"specific": {"versions":
        ["1"]}} | {"all": {}}."""
        if not data:
            return cls()
        if not isinstance(data, dict) or len(data) != 1:
            raise InvalidArgument(f"version_policy={data!r} must have exactly one of latest, "
                                  "specific, all", param="version_policy")
        ((kind, body),) = data.items()
        body = {} if body is None else body
        if not isinstance(body, dict):
            example = {"latest": '{"num_versions": 2}', "specific": '{"versions": ["1"]}'}
            raise InvalidArgument(f"version_policy.{kind}={body!r} must be an object, e.g. "
                                  f"{{\"{kind}\": {example.get(kind, '{}')}}}",
                                  param="version_policy")
        if kind == "all":
            return cls(latest=None, all=True)
        if kind == "latest":
            num = body.get("num_versions", 1)
            if isinstance(num, bool) or not isinstance(num, int) or num < 1:
                raise InvalidArgument(f"version_policy.latest.num_versions={num!r} must be an "
                                      "integer >= 1", param="version_policy")
            return cls(latest=num)
        if kind == "specific":
            versions = body.get("versions")
            if not isinstance(versions, list) or not versions:
                raise InvalidArgument(f"version_policy.specific.versions={versions!r} must be a "
                                      "non-empty list", param="version_policy")
            bad = [v for v in versions
                   if isinstance(v, bool) or not isinstance(v, int | str) or str(v) == ""]
            if bad:
                raise InvalidArgument(f"version_policy.specific.versions has {bad!r}; each "
                                      "version is a number or a non-empty string",
                                      param="version_policy")
            return cls(latest=None, specific=tuple(str(v) for v in versions))
        raise InvalidArgument(f"version_policy kind {kind!r} is unknown; use latest, specific "
                              "or all", param="version_policy")

    def select(self, versions: list[str]) -> list[str]:
        """The versions to serve among those packaged."""
        ordered = sorted(versions, key=version_key)
        if self.all:
            return ordered
        if self.specific:
            missing = [v for v in self.specific if v not in versions]
            if missing:
                raise NotFound(f"versions {missing} are not packaged (packaged: {ordered})",
                               param="version_policy")
            return [v for v in ordered if v in self.specific]
        return ordered[-(self.latest or 1):]
