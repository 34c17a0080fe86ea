"""The server's side of the constraint compile worker (:mod:`podium.constraints.compile.worker`).

One :class:`CompileProcess` per tokenizer in a server process. It is spoken to from the event
loop only: a request's spec goes down the worker's input as one line, and the answer line is
handed to its waiters in the loop's callback for the bytes that carry it. So the wait for a
compile takes no thread, no GIL hand-over and no task of its own in the server: a waiting
request resumes at the loop's next turn after its answer arrives (before, a reader task, a task
per spec and a shield stood in between: four turns of a loop that serves every stream).

The worker starts at the first constrained request (the server's own threads compile until it
says ready: 6-8 s here, loading the tokenizer and the kernels), or at boot when the package
names a constraint catalog, which it tokenizes before it says ready
(:meth:`CompileProcess.wait_ready`). It is started again if it dies; a request whose compile
was in flight when it died is compiled by the server's threads instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Callable
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


Answer = Callable[[dict[str, Any] | WorkerGone], None]
"""Called in the event loop with the worker's answer to one message, or with WorkerGone."""


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
        self._waiting: dict[int, Answer] = {}
        self._hello: asyncio.Future[bytes] | None = None  # the ready line, once it comes
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
        return [sys.executable, "-m", "podium.constraints.compile.worker", *self._args,
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

    def send(self, spec: bytes, answer: Answer) -> None:
        """Send one normalized spec (its canonical JSON, UTF-8); `answer` gets the reply."""
        self._send(b'"spec":%s' % spec, answer)

    async def remember(self, catalog: Path) -> dict[str, Any]:
        """Have the running worker tokenize a catalog file (its answer: strings, skipped,
        seconds, or an error); once it took it, every later start of the worker reads it."""
        done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

        def answered(message: dict[str, Any] | WorkerGone) -> None:
            if done.done():
                return
            if isinstance(message, WorkerGone):
                done.set_exception(message)
            else:
                done.set_result(message)

        self._send(b'"catalog":' + msgspec.json.encode(str(catalog)), answered)
        answer = await done
        if "catalog" in answer and catalog not in self.catalogs:
            self.catalogs.append(catalog)
        return answer

    def _send(self, fields: bytes, answer: Answer) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdin.is_closing():
            raise WorkerGone("the worker's input is closed")
        rid = self._next_id = self._next_id + 1
        self._waiting[rid] = answer
        # no drain: a line is a few kB and the worker reads its input all the time
        proc.stdin.write(b'{"id":%d,%s}\n' % (rid, fields))

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
            await self._until_exit(proc)

    async def _spawn(self) -> asyncio.subprocess.Process | None:
        """The started worker once it says ready (its ready line logged), else None."""
        loop = asyncio.get_running_loop()
        self._hello = hello = loop.create_future()
        proc: asyncio.subprocess.Process | None = None
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: _Lines(self._line, loop), *self.command,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
            proc = asyncio.subprocess.Process(transport, protocol, loop)
            exited = asyncio.ensure_future(proc.wait())
            await asyncio.wait([hello, exited], timeout=READY_TIMEOUT_S,
                               return_when=asyncio.FIRST_COMPLETED)
            if not hello.done():
                if not exited.done():
                    raise TimeoutError(f"no ready line in {READY_TIMEOUT_S:.0f} s")
                log.warning("the constraint compile worker exited at start (code %s); the "
                            "server's threads compile meanwhile", exited.result())
                return None
            exited.cancel()  # _until_exit waits for the exit from here on
            ready = self._decode(hello.result())
            fingerprint = ready["ready"]
        except (OSError, TimeoutError, msgspec.DecodeError, KeyError, TypeError) as exc:
            log.warning("the constraint compile worker did not start (%s: %s); the server's "
                        "threads compile meanwhile", type(exc).__name__, exc)
            if proc is not None:  # started, but not ready in time or not readable
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            return None
        self._proc, self.fingerprint = proc, fingerprint
        log.info("constraint compile worker %d ready%s", proc.pid, _catalog_line(ready))
        return proc

    def _line(self, line: bytes) -> None:
        """One line from the worker, in the loop's data callback: the ready line, else an
        answer handed to its waiter here and now."""
        hello = self._hello
        if hello is not None and not hello.done():
            hello.set_result(line)
            return
        try:
            message = self._decode(line)
            answer = self._waiting.pop(message["id"], None)
        except (msgspec.DecodeError, KeyError, TypeError) as exc:  # never expected: a bug
            log.error("unreadable answer from the constraint compile worker: %s", exc)
            if self._proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.kill()
            return
        if answer is not None:
            answer(message)

    async def _until_exit(self, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        if proc.stdin is not None:
            proc.stdin.close()
        if code != 0 or self._waiting:
            log.warning("the constraint compile worker %d exited (code %s) with %d compiles "
                        "in flight; they compile in the server's threads", proc.pid, code,
                        len(self._waiting))
        self.fingerprint = None
        waiting, self._waiting = self._waiting, {}
        for answer in waiting.values():
            answer(WorkerGone(f"exit code {code}"))


class _Lines(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's own protocol for a subprocess with pipes (its ``stdin`` writer, its exit),
    except that the worker's output goes, line by line, to a callback instead of a reader."""

    def __init__(self, on_line: Callable[[bytes], None], loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=LINE_LIMIT, loop=loop)
        self._on_line, self._partial = on_line, b""

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd != 1:
            return
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > LINE_LIMIT:  # a worker's bug; its answers are ~150 bytes
            log.error("the constraint compile worker wrote a line over %d bytes", LINE_LIMIT)
            self._partial = b""
        for line in lines:
            try:
                self._on_line(line)
            except Exception:  # a waiter's bug must not take the worker's pipe down
                log.exception("handling an answer of the constraint compile worker")


def _catalog_line(ready: dict[str, Any]) -> str:
    """What the worker's ready line says of its catalogs, for the log."""
    if not ready.get("catalog"):
        return ""
    return (f": {ready['catalog']} catalog strings tokenized in {ready['seconds']:.2f} s "
            f"({ready['skipped']} the tokenizer cannot reproduce, left out)")
