"""Pack a package directory into .tar.gz and unpack one safely.

Unpacking streams the archive once, checking each member before writing it, and refuses
anything that could escape the target directory or surprise the host: absolute paths, `..`
components, links that point outside the package, device files and FIFOs, and archives past
the size caps or the decompression ratio cap. A refused archive leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from podium.errors import PackageError, UnsafeArchive
from podium.package.inflate import BoundedInflate
from podium.package.manifest import MANIFEST_NAME
from podium.package.paths import is_inside, kind_of, package_entries


@dataclass(frozen=True)
class ArchiveLimits:
    """Caps applied while unpacking an untrusted archive."""

    max_total_bytes: int = 64 * 1024**3
    """Sum of all member sizes (64 GiB)."""
    max_members: int = 100_000
    """Number of entries."""
    max_member_bytes: int = 32 * 1024**3
    """Largest single file (32 GiB)."""
    max_ratio: float = 100.0
    """Decompressed bytes per compressed byte (model weights compress ~1.3x; a bomb ~1000x)."""
    ratio_floor_bytes: int = 16 * 1024**2
    """Output any archive may reach whatever its ratio (16 MiB: small packages are all
    headers and padding, which compress far past the ratio)."""


def pack(source: Path, target: Path) -> Path:
    """Write `source` (a package directory) to the .tar.gz `target`, members relative to it;
    written beside `target` and renamed into place, so a failure leaves no partial archive."""
    if not (source / MANIFEST_NAME).is_file():
        raise UnsafeArchive(f"{source}: not a package directory (no {MANIFEST_NAME})")
    if target.is_dir():
        raise PackageError(f"{target} is a directory; name the .tar.gz file to write")
    source = source.resolve()
    target = target.parent.resolve() / target.name
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    # an -o inside the package is not packed into itself
    entries = [e for e in package_entries(source) if source / e not in (target, partial)]
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(partial, "w:gz") as tar:
            for entry in entries:
                tar.add(source / entry, arcname=str(entry), recursive=False)
        os.replace(partial, target)
    except OSError as exc:
        failed = f"{exc.strerror}: {exc.filename}" if exc.filename else str(exc)
        raise PackageError(f"{target}: cannot write the archive ({failed})") from None
    finally:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
    return target


def unpack(archive: Path, target: Path, limits: ArchiveLimits | None = None) -> Path:
    """Safely extract `archive` into the empty or new directory `target`, streaming: every
    member is checked before it is written, and on any failure `target` is removed."""
    limits = limits or ArchiveLimits()
    size = _archive_size(archive)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UnsafeArchive(f"{target}: cannot unpack here ({exc.strerror})") from None
    checker = _MemberChecker(limits, archive, size)
    try:
        with archive.open("rb") as raw:
            stream = BoundedInflate(
                raw, archive, size, max_ratio=limits.max_ratio,
                ratio_floor_bytes=limits.ratio_floor_bytes,
                max_bytes=limits.max_total_bytes + 1536 * limits.max_members + (1 << 20))
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                for member in tar:
                    checker.check(member)
                    _extract_one(tar, member, target)
    except BaseException as exc:
        shutil.rmtree(target, ignore_errors=True)
        if isinstance(exc, tarfile.FilterError):
            raise UnsafeArchive(f"{archive}: refused by the extraction filter ({exc})") from None
        if isinstance(exc, tarfile.TarError | EOFError):
            raise UnsafeArchive(f"{archive}: not a readable tar archive ({exc}); "
                                "repack it with `podium package`") from None
        if isinstance(exc, OSError):
            raise UnsafeArchive(f"{archive}: cannot be unpacked ({exc})") from None
        raise
    return target


def _archive_size(archive: Path) -> int:
    try:
        info = os.stat(archive)
    except OSError as exc:
        raise UnsafeArchive(f"{archive}: cannot be read ({exc.strerror})") from None
    kind = kind_of(info.st_mode)
    if kind != "regular file":
        raise UnsafeArchive(f"{archive} is a {kind}; a package archive is a regular .tar.gz "
                            "file")
    return info.st_size


class _MemberChecker:
    """The per-member rules, applied in archive order with running totals."""

    def __init__(self, limits: ArchiveLimits, archive: Path, compressed_size: int) -> None:
        self.limits = limits
        self.archive = archive
        self.num_members = 0
        self.total = 0
        # the sizes the headers declare are bounded by the ratio too, so a bomb is refused
        # from its header, before a byte of it is written
        self.max_declared = min(limits.max_total_bytes, max(
            limits.ratio_floor_bytes, int(limits.max_ratio * compressed_size)))

    def check(self, member: tarfile.TarInfo) -> None:
        archive, limits = self.archive, self.limits
        self.num_members += 1
        if self.num_members > limits.max_members:
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
        self.total += member.size
        if self.total > limits.max_total_bytes:
            raise UnsafeArchive(f"{archive}: unpacks to more than {limits.max_total_bytes} bytes")
        if self.total > self.max_declared:
            raise UnsafeArchive(
                f"{archive}: unpacks to more than {self.max_declared} bytes, over "
                f"{limits.max_ratio:g} times its compressed size (a decompression bomb?); "
                "packages this compressible are refused")


def _extract_one(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    # the "data" filter re-checks every member (defence in depth on top of our own checks)
    tar.extract(member, target, filter="data")
    dest = target / member.name
    if dest.is_symlink() and not is_inside(target.resolve(), dest.resolve()):
        dest.unlink()
        raise UnsafeArchive(f"link {member.name!r} resolves outside the package")


def _escapes(path: PurePosixPath) -> bool:
    depth = 0
    for part in path.parts:
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            return True
    return False
