"""Fuzzing the manifest reader and the archive reader (fixed seed, bounded examples): any input
is either accepted or refused with a PackageError, and a refused archive leaves nothing."""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podium.errors import PackageError
from podium.package.archive import unpack
from podium.package.manifest import load_manifest
from podium.package.package import open_package
from tests.support import hostile as h

FUZZ = settings(derandomize=True, max_examples=120, deadline=None, database=None)

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from([*h.GOOD_MANIFEST, "module", "model_file", "weights",
                                       "parameters", "x"]) | st.text(max_size=8),
                      children, max_size=5),
    max_leaves=30)


def _good_archive_bytes() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in (("podium.json", json.dumps(h.GOOD_MANIFEST).encode()),
                           ("model.py", h.GOOD_MODEL.encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


GOOD_ARCHIVE = _good_archive_bytes()


def _mutated(data: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    mutated = bytearray(data)
    for index, value in edits:
        mutated[index % len(mutated)] = value
    return bytes(mutated[:cut] if cut is not None else mutated)


@FUZZ
@given(raw=st.binary(max_size=200) | _json.map(lambda v: json.dumps(v).encode())
       | st.fixed_dictionaries({"name": st.text(max_size=10), "backend": st.sampled_from(
           ["python", "xgboost", "vllm", "onnx"])}, optional={
           "module": st.text(max_size=20), "model_file": st.text(max_size=20),
           "version": _json, "inputs": _json}).map(lambda v: json.dumps(v).encode()))
def test_any_manifest_is_accepted_or_refused_in_one_line(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "podium.json"
        path.write_bytes(raw)
        try:
            load_manifest(path)
        except PackageError as exc:
            assert exc.message and "\n" not in exc.message


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
       cut=st.none() | st.integers(0, len(GOOD_ARCHIVE)))
def test_any_damaged_archive_is_unpacked_or_refused_leaving_nothing(
        edits: list[tuple[int, int]], cut: int | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "a.tar.gz"
        archive.write_bytes(_mutated(GOOD_ARCHIVE, edits, cut))
        target = Path(tmp) / "out"
        try:
            unpack(archive, target)
        except PackageError:
            assert not target.exists()
        else:
            for current, dirs, files in os.walk(target):
                for name in dirs + files:
                    path = Path(current) / name
                    assert path.is_dir() or path.is_file() or path.is_symlink()
        assert sorted(p.name for p in Path(tmp).iterdir()) in (["a.tar.gz"],
                                                                ["a.tar.gz", "out"])


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1,
                      max_size=3))
def test_open_package_of_a_damaged_archive_leaves_no_staging(
        edits: list[tuple[int, int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setenv("PODIUM_HOME", str(Path(tmp) / "home"))
        archive = Path(tmp) / "a.tar.gz"
        archive.write_bytes(_mutated(GOOD_ARCHIVE, edits, None))
        try:
            package = open_package(archive)
        except PackageError:
            pass
        else:
            assert (package.root / "podium.json").is_file()
        unpacked = Path(tmp) / "home" / "unpacked"
        leftovers = [p.name for p in unpacked.iterdir() if ".partial" in p.name]
        assert leftovers == []
