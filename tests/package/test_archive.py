"""Safe unpacking: nothing in an archive may escape the package or surprise the host."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest

from podium.errors import PackageError, UnsafeArchive
from podium.package.archive import ArchiveLimits, pack, unpack
from podium.package.inflate import BoundedInflate
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
    archive = _tar(tmp_path / "a.tar.gz", [_member("first"), member])
    with pytest.raises(UnsafeArchive):
        unpack(archive, tmp_path / "out")
    assert not (tmp_path / "evil").exists()
    assert not (tmp_path / "out").exists()  # what was unpacked before the refusal is gone


def test_size_caps(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "a.tar.gz", [_member("big", size=10)], b"0123456789")
    with pytest.raises(UnsafeArchive, match="cap"):
        unpack(archive, tmp_path / "out", ArchiveLimits(max_member_bytes=5))
    with pytest.raises(UnsafeArchive, match="more than"):
        unpack(archive, tmp_path / "out2", ArchiveLimits(max_total_bytes=5))


def _zeros_archive(path: Path, size: int) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        info = _member("zeros", size=size)
        tar.addfile(info, io.BytesIO(bytes(size)))
    return path


def test_ratio_cap_spares_small_archives_and_stops_bombs(tmp_path: Path) -> None:
    archive = _zeros_archive(tmp_path / "z.tar.gz", 4 * 1024 * 1024)  # ~1000x, under 16 MiB
    assert (unpack(archive, tmp_path / "ok") / "zeros").stat().st_size == 4 * 1024 * 1024
    with pytest.raises(UnsafeArchive, match="100 times its compressed size"):
        unpack(archive, tmp_path / "refused", ArchiveLimits(ratio_floor_bytes=1024 * 1024))
    assert not (tmp_path / "refused").exists()
    assert unpack(archive, tmp_path / "lenient", ArchiveLimits(
        max_ratio=2000, ratio_floor_bytes=1024 * 1024)).is_dir()


def test_ratio_cap_holds_while_streaming_whatever_the_headers_say(tmp_path: Path) -> None:
    """A member whose header understates its size cannot smuggle output past the cap."""
    stream = io.BytesIO(gzip.compress(bytes(8 * 1024 * 1024)))
    inflate = BoundedInflate(stream, tmp_path / "x.gz", len(stream.getvalue()), max_ratio=10,
                             ratio_floor_bytes=1024 * 1024, max_bytes=1 << 40)
    with pytest.raises(UnsafeArchive, match="10 times"):
        while inflate.read(1 << 16):
            pass
    assert inflate.produced <= 1024 * 1024 + (1 << 16)


def test_failed_pack_leaves_no_partial_archive_and_keeps_the_old_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "pkg"
    src.mkdir()
    (src / "podium.json").write_text(json.dumps(MANIFEST))
    (src / "a.bin").write_bytes(b"a")
    (src / "b.bin").write_bytes(b"b")
    target = tmp_path / "out" / "p.tar.gz"
    target.parent.mkdir()
    target.write_bytes(b"old")
    real_add = tarfile.TarFile.add

    def failing_add(self, name, *args, **kwargs):
        if str(name).endswith("b.bin"):
            raise OSError(5, "Input/output error", str(name))
        return real_add(self, name, *args, **kwargs)

    monkeypatch.setattr(tarfile.TarFile, "add", failing_add)
    with pytest.raises(PackageError, match="Input/output error"):
        pack(src, target)
    assert sorted(p.name for p in target.parent.iterdir()) == ["p.tar.gz"]
    assert target.read_bytes() == b"old"


def test_output_inside_the_package_is_not_packed_into_itself(tmp_path: Path) -> None:
    src = tmp_path / "pkg"
    src.mkdir()
    (src / "podium.json").write_text(json.dumps(MANIFEST))
    pack(src, src / "p.tar.gz")
    with tarfile.open(src / "p.tar.gz") as tar:
        assert tar.getnames() == ["podium.json"]


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
