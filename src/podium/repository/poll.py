"""`--model-control-mode poll`: the repository folder watched for changes, as Triton's poll
mode does, every `--repository-poll-secs`.

Only Triton models (`DIR/<model>/config.pbtxt`) are watched. Per model a fingerprint is taken
of its config, each numbered version folder and its other files (paths, sizes, mtimes):

    a new model folder             load it (a failure goes to the index, as at start)
    a model folder gone            unload it and forget it
    version folders added/removed  load the new ones, unload the removed ones
    config.pbtxt or a file changed reload the model (unload, then load)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from podium.errors import PodiumError
from podium.repository.repository import ModelRepository
from podium.triton.config import CONFIG_NAME

log = logging.getLogger("podium.repository.poll")


@dataclass(frozen=True)
class Fingerprint:
    """What a poll compares of one model folder."""

    config: str
    versions: dict[str, str]
    """Version folder → its files' fingerprint."""
    others: str
    """The model folder's files outside config.pbtxt and the version folders."""


def fingerprints(root: Path) -> dict[str, Fingerprint]:
    """Every Triton model folder of the repository `root`, by model name."""
    result = {}
    for config in sorted(root.glob(f"*/{CONFIG_NAME}")):
        folder = config.parent
        parts: dict[str, list[str]] = {}
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(folder)
            if "__pycache__" in relative.parts or not path.is_file() or path == config:
                continue
            try:
                stat = path.stat()
            except OSError:
                continue  # removed while walking: the next poll sees it
            top = relative.parts[0] if len(relative.parts) > 1 and \
                relative.parts[0].isdigit() else ""
            parts.setdefault(top, []).append(f"{relative}:{stat.st_size}:{stat.st_mtime_ns}")
        versions = {p.name: "" for p in folder.iterdir() if p.is_dir() and p.name.isdigit()}
        versions.update({k: "|".join(v) for k, v in parts.items() if k})
        try:
            stat = config.stat()
        except OSError:
            continue
        result[folder.name] = Fingerprint(f"{stat.st_size}:{stat.st_mtime_ns}", versions,
                                          "|".join(parts.get("", [])))
    return result


class RepositoryPoller:
    """Brings the repository's served models in line with its folder, one poll at a time."""

    def __init__(self, repository: ModelRepository) -> None:
        if repository.root is None:
            raise ValueError("polling needs a --repository folder")
        self.repository = repository
        self.root = repository.root
        self._seen = fingerprints(self.root)

    async def poll_once(self) -> list[str]:
        """One poll: the changes made, as `load NAME` / `reload NAME` / `unload NAME`."""
        now = fingerprints(self.root)
        done = []
        for name in sorted(set(self._seen) - set(now)):
            await self.repository.forget(name)
            done.append(f"unload {name}")
        for name, print_ in sorted(now.items()):
            before = self._seen.get(name)
            if before == print_:
                continue
            reload = before is not None and (
                before.config != print_.config or before.others != print_.others
                or any(before.versions[v] != print_.versions[v]
                       for v in set(before.versions) & set(print_.versions)))
            if reload and self.repository.is_served(name):
                await self.repository.unload(name)
            try:
                await self.repository.load_model(name)
                done.append(f"{'reload' if reload else 'load'} {name}")
            except PodiumError as exc:  # the index keeps the reason, as at start
                log.error("poll: model %s is not served: %s", name, exc.message)
                done.append(f"failed {name}")
        self._seen = now
        for change in done:
            log.info("poll: %s", change)
        return done
