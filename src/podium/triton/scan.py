"""A Triton model repository: every `DIR/<model>/config.pbtxt` with numbered version folders.

A model that cannot be served (a malformed config, a field Podium does not honour, no version
folder) does not stop the others: its reason is returned by model name, for the repository
index, as Triton reports a model that failed to load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from podium.errors import PackageError
from podium.triton.config import CONFIG_NAME, check_supported, read_config
from podium.triton.package import TritonPackage, backend_kind, build_package

Failures = dict[tuple[str, str], str]
"""(model name, version or "") → why it does not serve."""


def is_triton_model(folder: Path) -> bool:
    return (folder / CONFIG_NAME).is_file()


def scan_triton(directory: Path) -> tuple[list[TritonPackage], Failures]:
    """The served versions of every Triton model in `directory`, and the failures by model."""
    packages: list[TritonPackage] = []
    failures: Failures = {}
    for config_path in sorted(Path(directory).glob(f"*/{CONFIG_NAME}")):
        root = config_path.parent
        try:
            packages += model_packages(root)
        except PackageError as exc:
            failures[(root.name, "")] = exc.message
    return packages, failures


def model_packages(root: Path, config: Any = None) -> list[TritonPackage]:
    """The packages of one Triton model folder: one per version its policy serves (`config`:
    a ModelConfig, already checked, that replaces config.pbtxt)."""
    where = str(root / CONFIG_NAME)
    if config is None:
        config = read_config(root / CONFIG_NAME)
        check_supported(config, where)
    if config.name and config.name != root.name:
        raise PackageError(f"{where}: name={config.name!r} differs from its folder "
                           f"{root.name!r}; Triton requires them equal", param="name")
    kind = backend_kind(config, where)
    versions = sorted((p.name for p in root.iterdir() if p.is_dir() and p.name.isdigit()),
                      key=int)
    if not versions:
        raise PackageError(f"{root}: no numbered version folder (e.g. {root}/1)",
                           param="version")
    return [build_package(root, v, config, kind)
            for v in select_versions(config, versions, where)]


def select_versions(config: Any, versions: list[str], where: str) -> list[str]:
    """Triton's `version_policy`: latest N (1 by default), all, or specific versions."""
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return versions
    if which == "specific":
        wanted = [str(v) for v in policy.specific.versions]
        missing = [v for v in wanted if v not in versions]
        if missing:
            raise PackageError(f"{where}: version_policy.specific names versions {missing}, "
                               f"which have no folder (folders: {versions})",
                               param="version_policy.specific.versions")
        return [v for v in versions if v in wanted]
    count = policy.latest.num_versions if which == "latest" else 1
    return versions[-max(count, 1):]
