"""Pack a package directory into .tar.gz and unpack one safely.

Unpacking refuses anything that could escape the target directory or surprise the host:
absolute paths, `..` components, links that point outside the package, device files and
FIFOs, and archives past the size caps.
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from podium.errors import UnsafeArchive
from podium.package.manifest import MANIFEST_NAME


@dataclass(frozen=True)
class ArchiveLimits:
    """Caps applied while unpacking an untrusted archive."""

    max_total_bytes: int = 64 * 1024**3
    """Sum of all member sizes (64 GiB)."""
    max_members: int = 100_000
    """Number of entries."""
    max_member_bytes: int = 32 * 1024**3
    """Largest single file (32 GiB)."""


def pack(source: Path, target: Path) -> Path:
    """Write `source` (a package directory) to the .tar.gz `target`, members relative to it."""
    if not (source / MANIFEST_NAME).is_file():
        raise UnsafeArchive(f"{source}: not a package directory (no {MANIFEST_NAME})")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(target, "w:gz") as tar:
        for path in sorted(source.rglob("*")):
            if path.is_symlink() and not _inside(source, path.resolve()):
                raise UnsafeArchive(f"{path}: link points outside the package")
            tar.add(path, arcname=str(path.relative_to(source)), recursive=False)
    return target


def unpack(archive: Path, target: Path, limits: ArchiveLimits | None = None) -> Path:
    """Safely extract `archive` into the empty or new directory `target`."""
    limits = limits or ArchiveLimits()
    target.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in _checked_members(tar, limits, archive):
                _extract_one(tar, member, target)
    except tarfile.TarError as exc:
        raise UnsafeArchive(f"{archive}: not a readable tar archive ({exc})") from None
    return target


def _checked_members(tar: tarfile.TarFile, limits: ArchiveLimits,
                     archive: Path) -> list[tarfile.TarInfo]:
    members: list[tarfile.TarInfo] = []
    total = 0
    for member in tar:
        if len(members) >= limits.max_members:
            raise UnsafeArchive(f"{archive}: more than {limits.max_members} entries")
        name = PurePosixPath(member.name)
        if name.is_absolute() or member.name.startswith("/"):
            raise UnsafeArchive(f"{archive}: absolute path {member.name!r} is not allowed")
        if ".." in name.parts:
            raise UnsafeArchive(f"{archive}: path {member.name!r} contains '..'")
        if member.ischr() or member.isblk() or member.isfifo() or member.isdev():
            raise UnsafeArchive(f"{archive}: {member.name!r} is a device or FIFO")
        if member.issym() or member.islnk():
            link = PurePosixPath(member.linkname)
            resolved = link if member.islnk() else name.parent / link
            if link.is_absolute() or _escapes(resolved):
                raise UnsafeArchive(
                    f"{archive}: link {member.name!r} -> {member.linkname!r} leaves the package")
        if member.size > limits.max_member_bytes:
            raise UnsafeArchive(f"{archive}: {member.name!r} is {member.size} bytes, over the "
                                f"{limits.max_member_bytes}-byte cap per file")
        total += member.size
        if total > limits.max_total_bytes:
            raise UnsafeArchive(f"{archive}: unpacks to more than {limits.max_total_bytes} bytes")
        members.append(member)
    return members


def _extract_one(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    # the "data" filter re-checks every member (defence in depth on top of our own checks)
    tar.extract(member, target, filter="data")
    dest = target / member.name
    if dest.is_symlink() and not _inside(target, dest.resolve()):
        dest.unlink()
        raise UnsafeArchive(f"link {member.name!r} resolves outside the package")


def _escapes(path: PurePosixPath) -> bool:
    depth = 0
    for part in path.parts:
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            return True
    return False


def _inside(root: Path, path: Path) -> bool:
    root = root.resolve()
    return path == root or root in path.parents
