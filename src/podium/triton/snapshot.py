"""One version of a Triton model as a folder of its own, for the control plane.

`podium announce ./repo/my_model` makes each numbered version folder a Podium version. An
instance serves one version (`podium serve LOCATION`), and the user's folder may change after
the announce, so each version is copied once into a snapshot:

    $PODIUM_HOME/triton/<name>/<version>-<digest>/<name>/
        config.pbtxt      the model's config, its version_policy cleared (one version here)
        <version>/        that version's folder, as it was
        ...               the model folder's other files (helpers model.py imports)

The snapshot is itself a Triton model folder with one version, so `podium serve` opens it
like any (`model_folder_packages`), and the instance answers `/v2/models/<name>/config` from
the config as announced. The digest covers every file copied: a snapshot is never rewritten.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from podium.errors import PackageError
from podium.triton.config import CONFIG_NAME, check_supported, read_config
from podium.triton.package import backend_kind


@dataclass(frozen=True)
class TritonModelFolder:
    """A Triton model folder named on the command line: the model, and which versions."""

    root: Path
    """The model folder (holding config.pbtxt)."""
    versions: list[str]
    """Its numbered version folders to announce, oldest first."""


def model_folder_of(location: Path) -> TritonModelFolder | None:
    """`./repo/my_model` (every version) or `./repo/my_model/2` (that version); None when
    `location` is neither (a Podium package)."""
    path = Path(location).expanduser()
    if (path / CONFIG_NAME).is_file() and not (path / "podium.json").exists():
        versions = numbered_versions(path)
        if not versions:
            raise PackageError(f"{path}: no numbered version folder (e.g. {path}/1)",
                               param="version")
        return TritonModelFolder(path.resolve(), versions)
    if path.name.isdigit() and (path.parent / CONFIG_NAME).is_file() and path.is_dir():
        return TritonModelFolder(path.parent.resolve(), [path.name])
    return None


def numbered_versions(root: Path) -> list[str]:
    return sorted((p.name for p in root.iterdir() if p.is_dir() and p.name.isdigit()), key=int)


def check_announceable(root: Path) -> str:
    """The model's Triton backend, once its config is one an instance can serve alone."""
    where = str(root / CONFIG_NAME)
    config = read_config(root / CONFIG_NAME)
    check_supported(config, where)
    kind = backend_kind(config, where)
    if kind == "ensemble":
        raise PackageError(f"{where}: an ensemble calls other models of its repository, and "
                           "an announced model is served alone; announce each step model and "
                           "call them from a pipeline, or serve the whole repository with "
                           "`podium serve --repository`", param="platform")
    return kind


def snapshot_version(root: Path, version: str, into: Path) -> Path:
    """Copy version `version` of the model at `root` under `into`; returns the snapshot's
    model folder (reused when an identical snapshot exists)."""
    from google.protobuf import text_format

    config = read_config(root / CONFIG_NAME)
    config.ClearField("version_policy")  # the snapshot holds one version: the default serves it
    config_text = text_format.MessageToString(config).encode()
    files = snapshot_files(root, version)
    digest = hashlib.sha256(config_text)
    for relative in files:
        digest.update(relative.as_posix().encode() + b"\0")
        with (root / relative).open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    target = into / root.name / f"{version}-{digest.hexdigest()[:16]}"
    if (target / root.name / CONFIG_NAME).is_file():
        return target / root.name
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model = staging / root.name
        model.mkdir()
        (model / CONFIG_NAME).write_bytes(config_text)
        for relative in files:
            (model / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / relative, model / relative)
        os.rename(staging, target)
    except FileExistsError:  # announced twice at once: the other copy is the same
        shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target / root.name


def snapshot_files(root: Path, version: str) -> list[Path]:
    """The regular files a version's snapshot holds (relative to `root`): the version folder
    and every file outside the numbered folders; a link is refused (it may point anywhere)."""
    chosen: list[Path] = []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        top = relative.parts[0]
        if relative.as_posix() == CONFIG_NAME or (top.isdigit() and top != version):
            continue
        if "__pycache__" in relative.parts:
            continue
        if path.is_symlink():
            raise PackageError(f"{path}: a symbolic link; announce copies the model's files, "
                               "so replace the link with the file", param="path")
        if path.is_file():
            chosen.append(relative)
    return chosen
