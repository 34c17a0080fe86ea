"""The server's side of the constraint compile worker (:mod:`podium.constraints.compile_worker`).

One :class:`CompileProcess` per tokenizer in a server process. It is spoken to from the event
loop only: a request's spec goes down the worker's input as one line and the loop reads the
answer from its output when it comes, so the wait for a compile takes no thread and no GIL
hand-over in the server. The worker starts at the first constrained request (the server's own
threads compile until it says ready: 6-8 s here, loading the tokenizer and the kernels), or at
boot when the package names a constraint catalog, which it tokenizes before it says ready
(:meth:`CompileProcess.wait_ready`). It is started again if it dies; a request whose compile
was in flight when it died is compiled by the server's threads instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 120.0
"""How long a worker may take to load the tokenizer and its kernels before it is given up."""
MAX_STARTS = 5
"""Starts per server process; past them the server's threads compile every spec."""
RESTART_AFTER_S = 5.0
"""The least time between two starts, so a worker that dies at once is not respawned in a loop."""
LINE_LIMIT = 1 << 20
"""The longest answer line read back (answers are ~150 bytes; a spec going down is unbounded)."""


class WorkerGone(Exception):
    """The worker exited (or never became ready) while a compile was in flight."""


class CompileProcess:
    """A compile worker for one tokenizer, bound to the event loop that started it."""

    def __init__(self, tokenizer: str, vocab_size: int, directory: Path) -> None:
        self._args = ["--tokenizer", tokenizer, "--vocab-size", str(vocab_size),
                      "--directory", str(directory)]
        self.catalogs: list[Path] = []
        """Catalog files the worker tokenizes before it says ready, at every start."""
        self.fingerprint: str | None = None
        """The tokenizer's fingerprint as the worker computed it; set once it is ready."""
        self.starts = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._starting: asyncio.Task[None] | None = None
        self._settled: asyncio.Event | None = None  # set when a start is ready or failed
        self._last_start = float("-inf")
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next_id = 0
        self._decode = msgspec.json.Decoder().decode

    def ready(self) -> bool:
        """Whether a compile can go to the worker now, from the running loop; if not, a start
        is begun (when due) and the caller compiles in its own threads meanwhile."""
        loop = asyncio.get_running_loop()
        if self._proc is not None and self._proc.returncode is None and self._loop is loop:
            return self.fingerprint is not None
        if self._loop is not None and self._loop is not loop and not self._loop.is_closed():
            return False  # another loop's worker (tests run several loops): not this one's
        self._maybe_start(loop)
        return False

    @property
    def command(self) -> list[str]:
        catalogs = [arg for path in self.catalogs for arg in ("--catalog", str(path))]
        return [sys.executable, "-m", "podium.constraints.compile_worker", *self._args,
                *catalogs]

    async def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> bool:
        """Start the worker now if it is not running and wait until it is ready; False when
        it did not become ready (the server's threads compile meanwhile)."""
        if self.ready():
            return True
        settled = self._settled
        if settled is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(settled.wait(), timeout_s)
        return self.ready()

    async def compile(self, spec: bytes) -> dict[str, Any]:
        """The worker's answer for one normalized spec (its canonical JSON, UTF-8)."""
        return await self._ask(b'"spec":%s' % spec)

    async def remember(self, catalog: Path) -> dict[str, Any]:
        """Have the running worker tokenize a catalog file (its answer: strings, skipped,
        seconds, or an error); once it took it, every later start of the worker reads it."""
        answer = await self._ask(b'"catalog":' + msgspec.json.encode(str(catalog)))
        if "catalog" in answer and catalog not in self.catalogs:
            self.catalogs.append(catalog)
        return answer

    async def _ask(self, fields: bytes) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdin is not None
        rid = self._next_id = self._next_id + 1
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = answer
        try:
            self._proc.stdin.write(b'{"id":%d,%s}\n' % (rid, fields))
            await self._proc.stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            self._waiting.pop(rid, None)
            raise WorkerGone(str(exc)) from None
        return await answer

    def close(self) -> None:
        """Close the worker's input: it finishes what it holds and exits."""
        proc = self._proc
        if proc is None or proc.returncode is not None or proc.stdin is None:
            return
        try:
            proc.stdin.close()
        except RuntimeError:  # its event loop is closed already: nothing will read its answers
            proc.kill()

    def _maybe_start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._starting is not None and not self._starting.done():
            return
        now = time.monotonic()
        if self.starts >= MAX_STARTS or now - self._last_start < RESTART_AFTER_S:
            return
        self.starts += 1
        self._last_start = now
        self._loop, self._proc, self.fingerprint = loop, None, None
        self._settled = settled = asyncio.Event()
        self._starting = loop.create_task(self._start(settled), name="podium-constraint-worker")

    async def _start(self, settled: asyncio.Event) -> None:
        try:
            proc = await self._spawn()
        finally:
            settled.set()
        if proc is not None:
            await self._read_answers(proc)

    async def _spawn(self) -> asyncio.subprocess.Process | None:
        """The started worker once it says ready (its ready line logged), else None."""
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                limit=LINE_LIMIT)
            assert proc.stdout is not None
            hello = await asyncio.wait_for(proc.stdout.readline(), READY_TIMEOUT_S)
            ready = self._decode(hello) if hello else None
            fingerprint = ready["ready"] if ready else None
        except (OSError, TimeoutError, msgspec.DecodeError, KeyError, TypeError) as exc:
            log.warning("the constraint compile worker did not start (%s: %s); the server's "
                        "threads compile meanwhile", type(exc).__name__, exc)
            return None
        if fingerprint is None:
            log.warning("the constraint compile worker exited at start (code %s); the "
                        "server's threads compile meanwhile", await proc.wait())
            return None
        self._proc, self.fingerprint = proc, fingerprint
        log.info("constraint compile worker %d ready%s", proc.pid, _catalog_line(ready))
        return proc

    async def _read_answers(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        try:
            while line := await proc.stdout.readline():
                message = self._decode(line)
                waiting = self._waiting.pop(message["id"], None)
                if waiting is not None and not waiting.done():
                    waiting.set_result(message)
        except (ValueError, msgspec.DecodeError, KeyError) as exc:  # never expected: a bug
            log.error("unreadable answer from the constraint compile worker: %s", exc)
            proc.kill()
        code = await proc.wait()
        if proc.stdin is not None:
            proc.stdin.close()
        if code != 0 or self._waiting:
            log.warning("the constraint compile worker %d exited (code %s) with %d compiles "
                        "in flight; they compile in the server's threads", proc.pid, code,
                        len(self._waiting))
        self.fingerprint = None
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(WorkerGone(f"exit code {code}"))


def _catalog_line(ready: dict[str, Any]) -> str:
    """What the worker's ready line says of its catalogs, for the log."""
    if not ready.get("catalog"):
        return ""
    return (f": {ready['catalog']} catalog strings tokenized in {ready['seconds']:.2f} s "
            f"({ready['skipped']} the tokenizer cannot reproduce, left out)")
