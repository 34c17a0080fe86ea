"""Safe unpacking: nothing in an archive may escape the package or surprise the host."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from podium.errors import UnsafeArchive
from podium.package.archive import ArchiveLimits, pack, unpack
from podium.package.package import open_package

MANIFEST = {"name": "p", "backend": "python"}


def _tar(path: Path, members: list[tarfile.TarInfo], data: bytes = b"x") -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info in members:
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", size: int = 1):
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, size if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize("member", [
    pytest.param(_member("../evil"), id="dot-dot"),
    pytest.param(_member("a/../../evil"), id="nested-dot-dot"),
    pytest.param(_member("/etc/evil"), id="absolute"),
    pytest.param(_member("link", tarfile.SYMTYPE, "../../etc/passwd"), id="symlink-out"),
    pytest.param(_member("link", tarfile.SYMTYPE, "/etc/passwd"), id="symlink-absolute"),
    pytest.param(_member("hard", tarfile.LNKTYPE, "../x"), id="hardlink-out"),
    pytest.param(_member("dev", tarfile.CHRTYPE), id="char-device"),
    pytest.param(_member("blk", tarfile.BLKTYPE), id="block-device"),
    pytest.param(_member("fifo", tarfile.FIFOTYPE), id="fifo"),
])
def test_unsafe_members_are_rejected(tmp_path: Path, member: tarfile.TarInfo) -> None:
    archive = _tar(tmp_path / "a.tar.gz", [member])
    with pytest.raises(UnsafeArchive):
        unpack(archive, tmp_path / "out")
    assert not (tmp_path / "evil").exists()


def test_size_caps(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "a.tar.gz", [_member("big", size=10)], b"0123456789")
    with pytest.raises(UnsafeArchive, match="cap"):
        unpack(archive, tmp_path / "out", ArchiveLimits(max_member_bytes=5))
    with pytest.raises(UnsafeArchive, match="more than"):
        unpack(archive, tmp_path / "out2", ArchiveLimits(max_total_bytes=5))


def test_symlink_inside_package_is_kept(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "a.tar.gz", [_member("dir/file"),
                                           _member("dir/link", tarfile.SYMTYPE, "file")])
    out = unpack(archive, tmp_path / "out")
    assert (out / "dir" / "link").read_bytes() == b"x"


def test_not_an_archive(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not a tar")
    with pytest.raises(UnsafeArchive, match="not a readable tar"):
        unpack(bad, tmp_path / "out")


def test_pack_then_open_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PODIUM_HOME", str(tmp_path / "home"))
    src = tmp_path / "pkg"
    (src / "sub").mkdir(parents=True)
    (src / "podium.json").write_text(json.dumps(MANIFEST))
    (src / "sub" / "data.bin").write_bytes(b"\x00\x01")
    archive = pack(src, tmp_path / "p.tar.gz")
    package = open_package(archive)
    assert package.key == "p@1"
    assert (package.root / "sub" / "data.bin").read_bytes() == b"\x00\x01"
    assert open_package(archive).root == package.root  # unpacked once, reused
