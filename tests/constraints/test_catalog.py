"""A package's constraint catalog: read and checked, tokenized before requests (in the compile
worker or the server's threads), and a request over its strings then tokenizes none of them;
on the real tokenizer and the real worker process."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from podium.constraints.compile import vocab
from podium.constraints.compile.precompile import ConstraintPrecompiler
from podium.constraints.compile.store import FormStore
from podium.constraints.compile.vocab import TokenizerInfo
from podium.constraints.spec.admission import validate_constraint
from podium.errors import PackageError
from podium.package import catalog
from podium.package.catalog import read_catalog
from tests.support.catalog import make_titles

TITLES = make_titles(3000)
CATALOG, NEVER = TITLES[:2000], TITLES[2000:]


def _write(tmp_path: Path, data: bytes | str, name: str = "catalog.txt") -> Path:
    path = tmp_path / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def _distinct(items: list[str]) -> dict[str, Any]:
    return validate_constraint({"type": "distinct_items", "items": items, "min": 3, "max": 5})


def test_a_catalog_reads_one_string_a_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "\ufeffLa Haine\r\n\n  \nAmélie\nLa Haine\n  Padded  \nLast")
    assert read_catalog(path, tmp_path) == ["La Haine", "Amélie", "  Padded  ", "Last"]


@pytest.mark.parametrize(("data", "says"), [
    (b"ok\nfine\n\xff\xfe bad\n", "line 3 is not UTF-8 (byte 0xff)"),
    ("ok\n" + "x" * (catalog.MAX_STRING_CHARS + 1) + "\n", "line 2 is 4097 characters"),
    ("ok\nnul\0here\n", "line 2 holds a NUL character"),
    ("\n \n\r\n", "holds no string"),
], ids=["not-utf8", "long-line", "nul", "empty"])
def test_a_bad_catalog_is_refused_naming_the_field_and_line(tmp_path: Path, data: Any,
                                                            says: str) -> None:
    with pytest.raises(PackageError, match=re.escape(says)) as refused:
        read_catalog(_write(tmp_path, data), tmp_path)
    assert refused.value.param == "constraint_catalog"
    assert str(refused.value).startswith("constraint_catalog='catalog.txt'")


def test_a_catalog_over_its_caps_is_refused(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog, "MAX_CATALOG_STRINGS", 3)
    path = _write(tmp_path, "a\nb\nc\nd\n")
    with pytest.raises(PackageError, match="more than 3 strings"):
        read_catalog(path, tmp_path)
    monkeypatch.setattr(catalog, "MAX_CATALOG_BYTES", 4)
    with pytest.raises(PackageError, match="over the 4-byte cap"):
        read_catalog(path, tmp_path)


def test_a_catalog_that_is_a_fifo_or_leaves_the_package_is_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "package", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link.txt").symlink_to(_write(outside, "secret\n"))
    with pytest.raises(PackageError, match="outside the package"):
        read_catalog(root / "link.txt", root)
    os.mkfifo(root / "fifo.txt")
    with pytest.raises(PackageError, match="is a FIFO"):
        read_catalog(root / "fifo.txt", root)


def test_remembered_strings_are_not_tokenized_again_and_tokenize_the_same(
        smol_dir: Path, tok: TokenizerInfo) -> None:
    fresh = TokenizerInfo.from_pretrained(str(smol_dir))
    # this tokenizer drops \x16: left out as it is, kept as a JSON literal (\u0016)
    assert fresh.remember([*CATALOG, "8\x16"]) == 1
    fresh.tokenized_here()
    for quoted in (False, True):
        runs = fresh.encode_runs(CATALOG[::7], quoted=quoted)
        assert fresh.tokenized_here() == 0
        expected = tok.encode_runs(CATALOG[::7], quoted=quoted)
        assert np.array_equal(runs.flat, expected.flat)
        assert np.array_equal(runs.offsets, expected.offsets)
    fresh.encode_runs(NEVER[:30], quoted=True)
    assert fresh.tokenized_here() == 30


def test_the_memo_trims_requests_strings_and_keeps_the_catalogs(
        smol_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = TokenizerInfo.from_pretrained(str(smol_dir))
    fresh.encode_runs(NEVER[:50])  # a request's strings before the catalog came
    fresh.remember(CATALOG[:100])
    monkeypatch.setattr(vocab, "MEMO_SIZE", 60)
    fresh.encode_runs(NEVER[100:140])  # 50 + 40 request strings: past 60, so a trim
    fresh.tokenized_here()
    fresh.encode_runs(CATALOG[:100])
    assert fresh.tokenized_here() == 0, "the trim dropped catalog strings"
    fresh.encode_runs(NEVER[:50])
    assert fresh.tokenized_here() == 50, "the trim kept requests' strings past the bound"


def test_a_trim_by_another_thread_between_a_compiles_two_memo_steps_loses_nothing(
        smol_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two compile threads share the memo: when one adds its new strings and the other trims
    the memo before the first reads them back, the first still gets its tokens. (It read
    them back from the memo: a KeyError, which reached the client as a 400.)"""
    fresh = TokenizerInfo.from_pretrained(str(smol_dir))
    fresh.remember(CATALOG[:20])
    monkeypatch.setattr(vocab, "MEMO_SIZE", 1_000)

    class TrimmedRightAfter(dict):
        def update(self, *args: Any, **kwargs: Any) -> None:
            super().update(*args, **kwargs)
            kept = dict(list(self.items())[:20])  # the other thread's trim, at this instant
            self.clear()
            super().update(kept)

    fresh._quoted_memo = TrimmedRightAfter(fresh._quoted_memo)
    runs = fresh.encode_runs([*CATALOG[:5], *NEVER[:30]], quoted=True)
    expected = TokenizerInfo.from_pretrained(str(smol_dir)).encode_runs(
        [*CATALOG[:5], *NEVER[:30]], quoted=True)
    assert np.array_equal(runs.flat, expected.flat)
    assert np.array_equal(runs.offsets, expected.offsets)


@pytest.fixture
async def worker_compiler(smol_dir: Path, tmp_path: Path) -> Any:
    """A precompiler with a worker process, left to exit while its event loop still runs."""
    compiler = ConstraintPrecompiler(str(smol_dir), 49152, store=FormStore(tmp_path / "forms"),
                                     process=True)
    yield compiler
    compiler.shutdown()
    proc = compiler._worker._proc
    if proc is not None:
        await asyncio.wait_for(proc.wait(), 30)


async def test_the_worker_tokenizes_the_catalog_before_it_says_ready(
        worker_compiler: ConstraintPrecompiler, tmp_path: Path) -> None:
    compiler = worker_compiler
    path = _write(tmp_path, "\n".join(CATALOG) + "\n")
    await compiler.prepare(path, read_catalog(path, tmp_path))
    worker = compiler._worker
    assert worker.ready() and worker.starts == 1
    assert "--catalog" in worker.command
    known = await compiler.compile(_distinct(CATALOG[500:900]))
    assert (known.compiler, known.cached, known.tokenized) == ("process", False, 0)
    unknown = await compiler.compile(_distinct(CATALOG[:10] + NEVER[:25]))
    assert (unknown.compiler, unknown.tokenized) == ("process", 25)


async def test_a_running_worker_learns_a_catalog_given_after_its_start(
        worker_compiler: ConstraintPrecompiler, tmp_path: Path) -> None:
    """A second package of the same tokenizer (another version loaded beside the first)
    brings its catalog to a worker already running: the worker tokenizes it, without a
    restart; a file changed into a bad one since the server read it is refused."""
    compiler = worker_compiler
    first = _write(tmp_path, "\n".join(CATALOG[:1000]) + "\n", "first.txt")
    await compiler.prepare(first, read_catalog(first, tmp_path))
    worker = compiler._worker
    second = _write(tmp_path, "\n".join(CATALOG[1000:]) + "\n", "second.txt")
    before = await compiler.compile(_distinct(CATALOG[1500:1540]))
    assert (before.compiler, before.tokenized) == ("process", 40)  # not known yet
    await compiler.prepare(second, read_catalog(second, tmp_path))
    assert worker.starts == 1 and worker.catalogs == [first, second]
    after = await compiler.compile(_distinct(CATALOG[1600:1900]))
    assert (after.compiler, after.cached, after.tokenized) == ("process", False, 0)
    bad = _write(tmp_path, b"ok\n\xff\n", "third.txt")
    with pytest.raises(PackageError, match="constraint_catalog"):
        await compiler.prepare(bad, ["ok"])
    assert worker.ready(), "a refused catalog leaves the worker serving"
    assert worker.catalogs == [first, second], "and is not read at its next start"
    good = await compiler.compile(_distinct(CATALOG[:10] + NEVER[:5]))
    assert (good.compiler, good.tokenized) == ("process", 5)


async def test_without_a_worker_the_server_threads_remember_the_catalog(
        smol_dir: Path, tmp_path: Path) -> None:
    compiler = ConstraintPrecompiler(str(smol_dir), 49152, store=FormStore(tmp_path / "forms"),
                                     process=False)
    try:
        await compiler.prepare(tmp_path / "catalog.txt", CATALOG)
        known = await compiler.compile(validate_constraint(
            {"type": "choice", "choices": CATALOG[1000:1400]}))
        assert (known.compiler, known.tokenized) == ("thread", 0)
        unknown = await compiler.compile(validate_constraint(
            {"type": "choice", "choices": NEVER[:12]}))
        assert unknown.tokenized == 12
    finally:
        compiler.shutdown()
