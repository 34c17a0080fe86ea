"""Builders of hostile packages, archives and manifests, and the good package that follows them.

Every builder takes the test's `Layout` and returns the path to hand to the entry point; the
files it refers to outside the package live in `layout.outside`, so a test can check that
nothing there was read into, run or written.
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import os
import shutil
import socket
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

GOOD_MODEL = '''
class Model:
    def execute(self, requests):
        return [{"y": r["x"] * 2} for r in requests]
'''
IO = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}],
      "outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}]}
GOOD_MANIFEST = {"name": "good", "version": "1", "backend": "python", **IO}


@dataclass(frozen=True)
class Layout:
    """The directories of one test: only `home` and `out` may gain files, and only on success."""

    root: Path

    @property
    def outside(self) -> Path:
        return self.root / "outside"

    @property
    def bad(self) -> Path:
        return self.root / "bad"

    @property
    def good(self) -> Path:
        return self.root / "good"

    @property
    def good_archive(self) -> Path:
        return self.root / "good.tar.gz"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def out(self) -> Path:
        return self.root / "out"

    @property
    def marker(self) -> Path:
        """Written by `outside/evil.py` if anything ever imports it."""
        return self.outside / "evil-ran"

    def create(self) -> Layout:
        self.outside.mkdir(parents=True)
        (self.outside / "evil.py").write_text(
            f"open({str(self.marker)!r}, 'w').write('ran')\nclass Model: ...\n")
        (self.outside / "model.json").write_text("{}")
        (self.outside / "podium.json").write_text(json.dumps(GOOD_MANIFEST))
        write_package(self.good, GOOD_MANIFEST)
        _tar_dir(self.good, self.good_archive)
        self.out.mkdir()
        (self.out / "bad.tar.gz").write_bytes(b"a previous archive, never clobbered")
        self.home.mkdir()
        return self


def write_package(root: Path, manifest: dict, *, model: str = GOOD_MODEL) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "podium.json").write_text(json.dumps(manifest))
    (root / "model.py").write_text(model)
    return root


def _bad_package(layout: Layout, **fields: object) -> Path:
    return write_package(layout.bad, {**GOOD_MANIFEST, "name": "bad", **fields})


def _tar_dir(source: Path, target: Path) -> Path:
    with tarfile.open(target, "w:gz") as tar:
        for path in sorted(source.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(source)), recursive=False)
    return target


def _tar(target: Path, members: list[tuple[tarfile.TarInfo, bytes | None]],
         mode: str = "w:gz") -> Path:
    with tarfile.open(target, mode) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return target


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


def _with_manifest(*members: tuple[tarfile.TarInfo, bytes | None]) -> list:
    return [(_member("podium.json"), json.dumps({**GOOD_MANIFEST, "name": "bad"}).encode()),
            (_member("model.py"), GOOD_MODEL.encode()), *members]


# -- paths the manifest names ------------------------------------------------------------------

def module_dot_dot(layout: Layout) -> Path:
    return _bad_package(layout, module="../outside/evil.py")


def module_absolute(layout: Layout) -> Path:
    return _bad_package(layout, module=str(layout.outside / "evil.py"))


def module_symlink_out(layout: Layout) -> Path:
    root = _bad_package(layout, module="link.py")
    (root / "link.py").symlink_to(layout.outside / "evil.py")
    return root


def module_is_directory(layout: Layout) -> Path:
    root = _bad_package(layout, module="pkg")
    (root / "pkg").mkdir()
    return root


def module_symlink_loop(layout: Layout) -> Path:
    root = _bad_package(layout, module="a.py")
    (root / "a.py").symlink_to("b.py")
    (root / "b.py").symlink_to("a.py")
    return root


def module_nul_byte(layout: Layout) -> Path:
    return _bad_package(layout, module="model\0.py")


def model_file_dot_dot(layout: Layout) -> Path:
    root = write_package(layout.bad, {"name": "bad", "backend": "xgboost",
                                      "model_file": "../outside/model.json"})
    return root


def model_file_etc_hostname(layout: Layout) -> Path:
    return write_package(layout.bad, {"name": "bad", "backend": "xgboost",
                                      "model_file": "/etc/hostname"})


def model_file_fifo(layout: Layout) -> Path:
    root = write_package(layout.bad, {"name": "bad", "backend": "xgboost",
                                      "model_file": "model.json"})
    os.mkfifo(root / "model.json")
    return root


def weights_dot_dot(layout: Layout) -> Path:
    return write_package(layout.bad, {"name": "bad", "backend": "vllm",
                                      "weights": {"source": "package", "path": "../outside"}})


def tokenizer_dir_link_out(layout: Layout) -> Path:
    root = write_package(layout.bad, {
        "name": "bad", "backend": "vllm", "weights": {"source": "package", "path": "model.py"},
        "tokenizer": {"source": "package", "path": "tok"}})
    (root / "tok").symlink_to(layout.outside, target_is_directory=True)
    return root


# -- what else the package directory holds -----------------------------------------------------

def fifo_in_package(layout: Layout) -> Path:
    root = _bad_package(layout)
    (root / "data").mkdir()
    os.mkfifo(root / "data" / "pipe")
    return root


def socket_in_package(layout: Layout) -> Path:
    root = _bad_package(layout)
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(root / "s"))
    finally:
        sock.close()
    return root


def unnamed_link_out(layout: Layout) -> Path:
    root = _bad_package(layout)
    (root / "hostname").symlink_to("/etc/hostname")
    return root


# -- the manifest itself -----------------------------------------------------------------------

def _manifest_bytes(layout: Layout, data: bytes) -> Path:
    root = _bad_package(layout)
    (root / "podium.json").write_bytes(data)
    return root


def manifest_not_utf8(layout: Layout) -> Path:
    return _manifest_bytes(layout, b'{"name": "caf\xe9", "backend": "python"}')


def manifest_nested_100000(layout: Layout) -> Path:
    return _manifest_bytes(layout, b"[" * 100_000 + b"]" * 100_000)


def manifest_nested_40(layout: Layout) -> Path:
    deep = "[" * 40 + "]" * 40
    return _manifest_bytes(layout, f'{{"name": "bad", "backend": "python", '
                                   f'"parameters": {{"x": {deep}}}}}'.encode())


def manifest_huge(layout: Layout) -> Path:
    padding = " " * (2 * 1024 * 1024)
    return _manifest_bytes(layout, f'{{"name": "bad",{padding} "backend": "python"}}'.encode())


def manifest_huge_integer(layout: Layout) -> Path:
    return _manifest_bytes(layout, b'{"name": "bad", "backend": "python", "version": '
                           + b"9" * 5000 + b"}")


def manifest_truncated(layout: Layout) -> Path:
    return _manifest_bytes(layout, b'{"name": "bad", "backend": "pyt')


def manifest_empty(layout: Layout) -> Path:
    return _manifest_bytes(layout, b"")


def manifest_is_directory(layout: Layout) -> Path:
    root = layout.bad
    root.mkdir()
    (root / "podium.json").mkdir()
    return root


def manifest_is_fifo(layout: Layout) -> Path:
    root = layout.bad
    root.mkdir()
    os.mkfifo(root / "podium.json")
    return root


def manifest_link_out(layout: Layout) -> Path:
    root = layout.bad
    root.mkdir()
    (root / "podium.json").symlink_to(layout.outside / "podium.json")
    return root


# -- archives ----------------------------------------------------------------------------------

def archive_truncated(layout: Layout) -> Path:
    data = layout.good_archive.read_bytes()
    target = layout.root / "bad.tar.gz"
    target.write_bytes(data[: len(data) // 2])
    return target


def archive_bad_crc(layout: Layout) -> Path:
    data = bytearray(layout.good_archive.read_bytes())
    data[-8] ^= 0xFF  # the gzip trailer's CRC32
    target = layout.root / "bad.tar.gz"
    target.write_bytes(bytes(data))
    return target


@functools.cache
def _bomb_bytes() -> bytes:
    """A ~100 KB .tar.gz whose one member is 100 MiB of zeros (a ~1000x ratio)."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb") as gz, tarfile.open(fileobj=gz,
                                                                       mode="w|") as tar:
        info = _member("zeros")
        info.size = 100 * 1024 * 1024
        tar.addfile(info, _Zeros(info.size))
    return buffer.getvalue()


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return bytes(n)


def archive_gzip_bomb(layout: Layout) -> Path:
    target = layout.root / "bad.tar.gz"
    target.write_bytes(_bomb_bytes())
    return target


def archive_pax_header_bomb(layout: Layout) -> Path:
    """No member declares a size; the bomb is 20 MiB of extended header."""
    info = _member("podium.json")
    info.pax_headers = {"comment": "a" * (20 * 1024 * 1024)}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(b""))
    target = layout.root / "bad.tar.gz"
    target.write_bytes(buffer.getvalue())
    return target


def archive_dot_dot(layout: Layout) -> Path:
    return _tar(layout.root / "bad.tar.gz", _with_manifest((_member("../evil"), b"x")))


def archive_symlink_out(layout: Layout) -> Path:
    return _tar(layout.root / "bad.tar.gz",
                _with_manifest((_member("hosts", tarfile.SYMTYPE, "../../etc/hosts"), None)))


def archive_hardlink_absolute(layout: Layout) -> Path:
    return _tar(layout.root / "bad.tar.gz",
                _with_manifest((_member("h", tarfile.LNKTYPE, "/etc/hostname"), None)))


def archive_fifo(layout: Layout) -> Path:
    return _tar(layout.root / "bad.tar.gz", _with_manifest((_member("p", tarfile.FIFOTYPE),
                                                            None)))


def archive_no_manifest(layout: Layout) -> Path:
    return _tar(layout.root / "bad.tar.gz", [(_member("model.py"), GOOD_MODEL.encode())])


def archive_module_dot_dot(layout: Layout) -> Path:
    manifest = {**GOOD_MANIFEST, "name": "bad", "module": "../evil.py"}
    return _tar(layout.root / "bad.tar.gz", [(_member("podium.json"),
                                              json.dumps(manifest).encode())])


def archive_bzip2(layout: Layout) -> Path:
    target = layout.root / "bad.tar.gz"
    with tarfile.open(target, "w:bz2") as tar:
        tar.add(layout.good / "podium.json", arcname="podium.json")
    return target


def archive_not_tar(layout: Layout) -> Path:
    target = layout.root / "bad.tar.gz"
    target.write_bytes(gzip.compress(b"just some text, not a tar archive\n" * 40))
    return target


def archive_is_fifo(layout: Layout) -> Path:
    target = layout.root / "bad.tar.gz"
    os.mkfifo(target)
    return target


# -- `podium package` arguments ----------------------------------------------------------------

def output_is_directory(layout: Layout) -> Path:
    shutil.copytree(layout.good, layout.bad)
    (layout.out / "bad.tar.gz").unlink()
    (layout.out / "bad.tar.gz").mkdir()
    return layout.bad


def source_is_archive(layout: Layout) -> Path:
    return layout.good_archive


Builder = Callable[[Layout], Path]
