"""Paths inside a package: they stay inside after following links, and name only regular files
or directories (FIFOs, sockets and devices are refused from their `stat`, never opened).

Every path a manifest names (`model_file`, `module`, `constraint_catalog`, `weights.path` /
`tokenizer.path` of a `package` source) goes through `named_path`; `package_entries` walks a
whole package tree with the same rules, and `read_small_file` reads one file (the manifest, a
constraint catalog) under a size cap.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path, PurePath

from podium.errors import PackageError

FILE = "regular file"
DIRECTORY = "directory"


def kind_of(mode: int) -> str:
    """What a `st_mode` is, in the words an error message uses."""
    if stat.S_ISREG(mode):
        return FILE
    if stat.S_ISDIR(mode):
        return DIRECTORY
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISBLK(mode):
        return "block device"
    if stat.S_ISLNK(mode):
        return "symbolic link"
    return "special file"


def is_inside(root: Path, path: Path) -> bool:
    """Whether `path` (already resolved) is `root` (already resolved) or below it."""
    return path == root or root in path.parents


def named_path(root: Path, value: str, field: str, kinds: Iterable[str] = (FILE,), *,
               must_exist: bool = True) -> Path:
    """The resolved path a manifest field names, refused (naming the field) unless it lies
    inside the package after following links and is one of `kinds`."""
    kinds = tuple(kinds)
    root = root.resolve()
    where = f"{field}={value!r}"
    if not value or "\0" in value:
        raise PackageError(f"{where}: name a file inside the package, relative to podium.json",
                           param=field)
    if PurePath(value).is_absolute():
        raise PackageError(f"{where} is an absolute path; name a file inside the package, "
                           "relative to podium.json", param=field)
    resolved = Path(os.path.realpath(root / value))
    if not is_inside(root, resolved):
        raise PackageError(f"{where} resolves to {str(resolved)!r}, outside the package; copy "
                           "the file into the package and name it relative to podium.json",
                           param=field)
    try:
        mode = os.stat(resolved).st_mode
    except FileNotFoundError:
        if not must_exist:
            return resolved
        raise PackageError(f"{where}: the manifest names {value!r}, which is not in the "
                           "package; add the file or fix the manifest", param=field) from None
    except OSError as exc:
        raise PackageError(f"{where} cannot be read ({exc.strerror}); fix the path",
                           param=field) from None
    kind = kind_of(mode)
    if kind not in kinds:
        raise PackageError(f"{where} is a {kind}; it must be a {' or a '.join(kinds)}",
                           param=field)
    return resolved


def package_entries(root: Path, under: Path | None = None) -> list[Path]:
    """Every entry below `root` (or its folder `under`), relative to `root` and sorted,
    refusing FIFOs, sockets, devices and links that leave `root` or point at one of those."""
    root = root.resolve()
    entries: list[Path] = []
    for current, dirs, files in os.walk(under or root, onerror=_raise_walk_error):
        for name in dirs + files:
            path = Path(current) / name
            _check_entry(root, path)
            entries.append(path.relative_to(root))
    return sorted(entries)


def regular_files(root: Path) -> list[Path]:
    """The regular files of a package (links to them included), relative, sorted."""
    root = root.resolve()
    return [rel for rel in package_entries(root)
            if "__pycache__" not in rel.parts and (root / rel).is_file()]


def read_small_file(path: Path, root: Path, max_bytes: int, what: str) -> bytes:
    """The bytes of `path`, which must be a regular file inside `root` of at most `max_bytes`;
    checked from `stat` first so a FIFO or a huge file is refused without reading it."""
    root = root.resolve()
    resolved = Path(os.path.realpath(path))
    if not is_inside(root, resolved):
        raise PackageError(f"{path}: {what} resolves to {str(resolved)!r}, outside the package; "
                           f"make {path.name} a regular file in the package")
    try:
        info = os.stat(resolved)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise PackageError(f"{path}: {what} cannot be read ({exc.strerror})") from None
    _require_small_regular(path, info, max_bytes, what)
    # O_NONBLOCK: a file swapped for a FIFO after the stat above still cannot block us
    fd = os.open(resolved, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        _require_small_regular(path, os.fstat(fd), max_bytes, what)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise PackageError(f"{path}: {what} is over the {max_bytes}-byte cap; keep it small "
                           "(large data belongs in files next to it)")
    return data


def _require_small_regular(path: Path, info: os.stat_result, max_bytes: int, what: str) -> None:
    kind = kind_of(info.st_mode)
    if kind != FILE:
        raise PackageError(f"{path}: {what} is a {kind}; it must be a regular file")
    if info.st_size > max_bytes:
        raise PackageError(f"{path}: {what} is {info.st_size} bytes, over the {max_bytes}-byte "
                           "cap; keep it small (large data belongs in files next to it)")


def _check_entry(root: Path, path: Path) -> None:
    rel = str(path.relative_to(root))
    try:
        info = os.lstat(path)
    except FileNotFoundError:  # removed while we walked: nothing left to refuse
        return
    if stat.S_ISLNK(info.st_mode):
        target = Path(os.path.realpath(path))
        if not is_inside(root, target):
            raise PackageError(f"{root}: {rel!r} is a link to {str(target)!r}, outside the "
                               "package; copy the file into the package instead")
        try:
            info = os.stat(target)
        except OSError:  # a dangling link inside the package reads nothing: harmless
            return
    kind = kind_of(info.st_mode)
    if kind not in (FILE, DIRECTORY):
        raise PackageError(f"{root}: {rel!r} is a {kind}; a package holds only regular files "
                           "and directories, remove it")


def _raise_walk_error(exc: OSError) -> None:
    raise PackageError(f"{exc.filename}: cannot be listed ({exc.strerror})")
