"""Hostile packages, archives and manifests: each is refused by every entry point that opens
packages (`podium package`, `podium inspect`, announce, serve) with one line naming the field
or file, writes nothing outside its target, leaves no staging behind, and the good package
that follows it still works."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from podium.backends import create_backend
from podium.backends.base import InferenceRequest, Tensor
from podium.cli import main
from podium.control.api import create_app
from podium.control.plane import ControlPlane
from podium.control.store import Store
from podium.errors import PackageError
from podium.package.package import open_package
from tests.support import hostile as h
from tests.support.fake_world import FakeWorld

DIR = ("package", "inspect", "announce", "serve")
ARCHIVE = ("inspect", "announce", "serve")

ROWS = [
    # paths the manifest names
    pytest.param(h.module_dot_dot, "module='../outside/evil.py'", DIR, id="module-dot-dot"),
    pytest.param(h.module_absolute, "module=", DIR, id="module-absolute"),
    pytest.param(h.module_symlink_out, "'link.py' is a link", DIR, id="module-symlink-out"),
    pytest.param(h.module_is_directory, "module='pkg' is a directory", DIR,
                 id="module-is-directory"),
    pytest.param(h.module_symlink_loop, "module='a.py' cannot be read", ("package", "serve"),
                 id="module-symlink-loop"),
    pytest.param(h.module_nul_byte, "module=", DIR, id="module-nul-byte"),
    pytest.param(h.model_file_dot_dot, "model_file='../outside/model.json'", DIR,
                 id="model-file-dot-dot"),
    pytest.param(h.model_file_etc_hostname, "model_file='/etc/hostname' is an absolute", DIR,
                 id="model-file-etc-hostname"),
    pytest.param(h.model_file_fifo, "'model.json' is a FIFO", DIR, id="model-file-fifo"),
    pytest.param(h.weights_dot_dot, "weights.path='../outside'", DIR, id="weights-dot-dot"),
    pytest.param(h.tokenizer_dir_link_out, "'tok' is a link", DIR,
                 id="tokenizer-dir-link-out"),
    # what else the package directory holds
    pytest.param(h.fifo_in_package, "'data/pipe' is a FIFO", DIR, id="fifo-in-package"),
    pytest.param(h.socket_in_package, "'s' is a socket", DIR, id="socket-in-package"),
    pytest.param(h.unnamed_link_out, "'hostname' is a link", DIR, id="unnamed-link-out"),
    # the manifest itself
    pytest.param(h.manifest_not_utf8, "not UTF-8", DIR, id="manifest-not-utf8"),
    pytest.param(h.manifest_nested_100000, "nested too deeply", DIR,
                 id="manifest-nested-100000"),
    pytest.param(h.manifest_nested_40, "nested more than 32", DIR, id="manifest-nested-40"),
    pytest.param(h.manifest_huge, "over the 1048576-byte cap", DIR, id="manifest-2-mib"),
    pytest.param(h.manifest_huge_integer, "not valid JSON", DIR, id="manifest-huge-integer"),
    pytest.param(h.manifest_truncated, "not valid JSON", DIR, id="manifest-truncated"),
    pytest.param(h.manifest_empty, "not valid JSON", DIR, id="manifest-empty"),
    pytest.param(h.manifest_is_directory, "podium.json is a directory", DIR,
                 id="manifest-is-directory"),
    pytest.param(h.manifest_is_fifo, "podium.json is a FIFO", DIR, id="manifest-is-fifo"),
    pytest.param(h.manifest_link_out, "outside the package", DIR, id="manifest-link-out"),
    # archives
    pytest.param(h.archive_truncated, "truncated", ARCHIVE, id="archive-truncated"),
    pytest.param(h.archive_bad_crc, "corrupt gzip data", ARCHIVE, id="archive-bad-crc"),
    pytest.param(h.archive_gzip_bomb, "times its compressed size", ARCHIVE,
                 id="archive-gzip-bomb"),
    pytest.param(h.archive_pax_header_bomb, "times its compressed size", ARCHIVE,
                 id="archive-pax-header-bomb"),
    pytest.param(h.archive_dot_dot, "'../evil' contains '..'", ARCHIVE, id="archive-dot-dot"),
    pytest.param(h.archive_symlink_out, "link 'hosts'", ARCHIVE, id="archive-symlink-out"),
    pytest.param(h.archive_hardlink_absolute, "link 'h'", ARCHIVE,
                 id="archive-hardlink-absolute"),
    pytest.param(h.archive_fifo, "'p' is a device or FIFO", ARCHIVE, id="archive-fifo"),
    pytest.param(h.archive_no_manifest, "no podium.json", ARCHIVE, id="archive-no-manifest"),
    pytest.param(h.archive_module_dot_dot, "module='../evil.py'", ARCHIVE,
                 id="archive-module-dot-dot"),
    pytest.param(h.archive_bzip2, "compressed with bzip2", ARCHIVE, id="archive-bzip2"),
    pytest.param(h.archive_not_tar, "not a readable tar archive", ARCHIVE,
                 id="archive-not-tar"),
    pytest.param(h.archive_is_fifo, "is a FIFO", ARCHIVE, id="archive-is-fifo"),
    # `podium package` arguments
    pytest.param(h.output_is_directory, "is a directory", ("package",),
                 id="package-output-is-directory"),
    pytest.param(h.source_is_archive, "not a directory", ("package",),
                 id="package-source-is-archive"),
]


@pytest.mark.timeout(60)  # a FIFO opened by mistake blocks forever: fail instead
@pytest.mark.parametrize(("build", "expected", "entry_points"), ROWS)
def test_hostile_input_is_refused_then_a_good_package_works(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        build: h.Builder, expected: str, entry_points: tuple[str, ...]) -> None:
    layout = h.Layout(tmp_path).create()
    monkeypatch.setenv("PODIUM_HOME", str(layout.home))
    bad = build(layout)
    store = Store.open(f"sqlite:///{tmp_path / 'control.db'}")
    plane = ControlPlane(store, FakeWorld(), materialize=lambda _p: None)
    try:
        for entry_point in entry_points:
            before = _snapshot(layout)
            message = _refusal(entry_point, bad, layout, plane, capsys)
            assert expected in message, message
            assert "\n" not in message and "Traceback" not in message
            assert _snapshot(layout) == before, "a refused package changed the disk"
            assert not layout.marker.exists()
            _succeeds(entry_point, layout, plane, capsys)
    finally:
        store.close()


def _refusal(entry_point: str, bad: Path, layout: h.Layout, plane: ControlPlane,
             capsys: pytest.CaptureFixture[str]) -> str:
    """What the entry point says when refusing `bad`: the CLI's stderr, or the error raised."""
    if entry_point in ("package", "inspect"):
        argv = (["package", str(bad), "-o", str(layout.out / "bad.tar.gz")]
                if entry_point == "package" else ["inspect", str(bad), "--json"])
        capsys.readouterr()
        assert main(argv) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        err = captured.err.rstrip("\n")
        assert err.startswith("podium: error: ")
        return err
    if entry_point == "announce":  # `podium announce` posts the path to the control API
        response = TestClient(create_app(plane)).post("/v1/packages", json={"path": str(bad)})
        assert response.status_code == 400, response.text
        assert not [p for p in plane.store.list_packages() if p.name == "bad"]
        with pytest.raises(PackageError) as refused:
            plane.announce(str(bad))
        # the API refuses special files itself (stat only) before the plane opens anything:
        # then the body names the path; otherwise it carries the plane's message
        message = response.json()["error"]["message"]
        assert refused.value.message in message or (
            response.json()["error"]["param"] == "path" and str(bad) in message)
        return refused.value.message
    with pytest.raises(PackageError) as refused:  # what `podium serve PACKAGE` does first
        open_package(bad)                          # (server/boot.py, "open packages")
    return refused.value.message


def _succeeds(entry_point: str, layout: h.Layout, plane: ControlPlane,
              capsys: pytest.CaptureFixture[str]) -> None:
    if entry_point == "package":
        target = layout.out / "good.tar.gz"
        assert main(["package", str(layout.good), "-o", str(target)]) == 0
        assert open_package(target).key == "good@1"
    elif entry_point == "inspect":
        assert main(["inspect", str(layout.good_archive), "--json"]) == 0
        assert '"name": "good"' in capsys.readouterr().out
    elif entry_point == "announce":
        response = TestClient(create_app(plane)).post("/v1/packages",
                                                      json={"path": str(layout.good)})
        assert response.status_code == 201, response.text
    else:
        assert _serve_once(open_package(layout.good_archive), 21.0) == 42.0


def _serve_once(package, value: float) -> float:
    async def run() -> float:
        backend = create_backend(package)
        await backend.load()
        try:
            x = Tensor("x", "FP32", np.full((1, 1), value, np.float32))
            response = await backend.infer(InferenceRequest({"x": x}))
            return float(response.outputs[0].data.ravel()[0])
        finally:
            await backend.unload()
    return asyncio.run(run())


def _snapshot(layout: h.Layout) -> dict[str, tuple[int, int, int]]:
    """Every entry under the test's directories (but the control database): kind, size, mtime;
    directories by existence only (staging inside them would change their mtime)."""
    seen: dict[str, tuple[int, int, int]] = {}
    for current, dirs, files in os.walk(layout.root):
        for name in dirs + files:
            path = Path(current) / name
            rel = str(path.relative_to(layout.root))
            if rel.startswith("control.db") or "__pycache__" in rel:
                continue
            info = os.lstat(path)
            seen[rel] = ((info.st_mode, 0, 0) if path.is_dir() and not path.is_symlink()
                         else (info.st_mode, info.st_size, info.st_mtime_ns))
    # the unpack directory may come into being, empty
    if (layout.home / "unpacked").is_dir() and not any((layout.home / "unpacked").iterdir()):
        seen.pop("home/unpacked", None)
    return seen


@pytest.mark.parametrize("case", ["output-under-a-file", "home-is-a-file"])
def test_unusable_arguments_are_one_line_errors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        case: str) -> None:
    layout = h.Layout(tmp_path).create()
    monkeypatch.setenv("PODIUM_HOME", str(layout.home))
    if case == "output-under-a-file":
        argv = ["package", str(layout.good), "-o", str(layout.out / "bad.tar.gz" / "x.tar.gz")]
        expected = "cannot write the archive"
    else:
        monkeypatch.setenv("PODIUM_HOME", str(layout.out / "bad.tar.gz"))
        argv, expected = ["inspect", str(layout.good_archive)], "set PODIUM_HOME"
    before = _snapshot(layout)
    code = main(argv)
    err = capsys.readouterr().err.rstrip("\n")
    assert code == 2 and err.startswith("podium: error: ") and expected in err, err
    assert "\n" not in err
    assert _snapshot(layout) == before
    monkeypatch.setenv("PODIUM_HOME", str(layout.home))
    assert main(["package", str(layout.good), "-o", str(layout.out / "good.tar.gz")]) == 0
    assert main(["inspect", str(layout.out / "good.tar.gz"), "--json"]) == 0


def test_a_nul_byte_in_a_path_is_refused_not_raised(tmp_path: Path) -> None:
    """The control API passes paths from JSON, where "\\u0000" is a valid character."""
    layout = h.Layout(tmp_path).create()
    with pytest.raises(PackageError, match="cannot be read"):
        open_package(str(layout.good) + "\0")
    assert open_package(layout.good).key == "good@1"


def test_staging_left_by_a_dead_process_is_swept(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    layout = h.Layout(tmp_path).create()
    monkeypatch.setenv("PODIUM_HOME", str(layout.home))
    unpacked = layout.home / "unpacked"
    dead = unpacked / "0123456789abcdef.partial-999999999-x"  # past any pid_max
    (dead / "half").mkdir(parents=True)
    alive = unpacked / f"0123456789abcdef.partial-{os.getpid()}-y"
    alive.mkdir()
    assert open_package(layout.good_archive).key == "good@1"
    assert not dead.exists() and alive.is_dir()
