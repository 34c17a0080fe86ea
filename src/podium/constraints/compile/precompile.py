"""Compiling a request's constraint before it reaches the engine, off the event loop.

The frontend admits a spec (``admit_constraint``: validation, 400 on a bad one), then awaits
:func:`precompile_xargs`: the spec is compiled against the model's tokenizer, lowered to its
compact form, published to the host's :class:`FormStore`, and the request's extra arguments gain
the form's key. A server compiles built-in types in a worker process of its own
(:mod:`podium.constraints.compile.process`: the server's GIL is its event loop's), and in a
small thread pool until that worker is ready, for plugin types, and with
``PODIUM_CONSTRAINT_COMPILER=thread``. The engine's processor adopts the form by key and
never compiles. Identical specs share one form (and one compile, even when they arrive together).
A spec that does not compile fails its request alone, with a 400 naming ``constraint``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from podium.constraints.spec.admission import XARGS_KEY
from podium.errors import InvalidArgument, PackageError

log = logging.getLogger(__name__)

KEY_XARGS = "podium_constraint_key"
"""Extra argument naming the compiled form in the host's store (absent: the engine compiles)."""


@dataclass(frozen=True)
class Precompiled:
    """What admission learned compiling one request's constraint."""

    key: str | None
    """The form's key; None for a plugin type without a compact form (the engine compiles)."""
    seconds: float
    """Time this request waited for its compiled form (a cache hit: microseconds)."""
    cached: bool
    compiler: str = "thread"
    """Where it was compiled or found: ``process`` (the worker) or ``thread`` (the server's)."""
    tokenized: int = 0
    """Strings the compile had to tokenize (not in the tokenizer's memo or a catalog)."""


class ConstraintPrecompiler:
    """Compiles specs for one tokenizer into the host's store; thread-safe."""

    def __init__(self, tokenizer: str, vocab_size: int, *, store: Any = None,
                 workers: int = 2, process: bool | None = None, observe: bool = True) -> None:
        """`process`: compile built-in types in a worker process (None: as
        ``PODIUM_CONSTRAINT_COMPILER`` says); `observe`: record each compile's own time in this
        process's metrics (the worker leaves that to its server)."""
        from podium.constraints.compile.store import FormStore

        self.tokenizer_path, self.vocab_size = tokenizer, vocab_size
        self.store = store if store is not None else FormStore()
        if process is None:
            from podium.env import constraint_compiler

            process = constraint_compiler() == "process"
        self._worker: Any = None
        if process:
            from podium.constraints.compile.process import CompileProcess

            self._worker = CompileProcess(tokenizer, vocab_size, self.store.directory)
        self._asked: dict[str, list[asyncio.Future[Precompiled]]] = {}  # the worker's, by key
        self._pool = ThreadPoolExecutor(max_workers=workers,
                                        thread_name_prefix="podium-constraint-compile")
        self._lock = threading.Lock()
        self._inflight: dict[str, Future[Precompiled]] = {}
        self._tok: Any = None
        self._fingerprint: str | None = None
        self._observe = observe

    def load_tokenizer(self) -> tuple[Any, str]:
        """The tokenizer and its fingerprint, loaded on first use."""
        with self._lock:
            if self._tok is None:
                from podium.constraints.compile.vocab import TokenizerInfo

                tok = TokenizerInfo.from_pretrained(self.tokenizer_path, self.vocab_size)
                self._fingerprint = _fingerprint(tok)
                self._tok = tok
            assert self._fingerprint is not None
            return self._tok, self._fingerprint

    async def compile(self, normalized: dict[str, Any]) -> Precompiled:
        """Compile (or find) ``normalized`` off the event loop, which keeps serving."""
        start = time.perf_counter()
        result = await self._compile_off_loop(normalized)
        seconds = time.perf_counter() - start
        _observe(normalized["type"], result.cached, result.compiler, seconds)
        return Precompiled(result.key, seconds, result.cached, result.compiler, result.tokenized)

    async def prepare(self, catalog: Path, strings: list[str]) -> None:
        """Before the instance reports ready: the `strings` of a package's catalog file
        (:mod:`podium.package.catalog`, read and checked) tokenized where this server
        compiles. A worker that has not started starts now with the catalog, and this waits
        until it is ready; a worker already running (a second package of the same tokenizer)
        is sent the file and this waits for its answer. A restarted worker reads every
        catalog again. Without a worker, the server's threads remember the strings."""
        worker = self._worker
        if worker is not None:
            if await self._worker_remembers(worker, catalog):
                return
            log.warning("the constraint compile worker is not ready; the server's threads "
                        "tokenize the catalog %s", catalog)
        start = time.perf_counter()
        tok, _ = await asyncio.to_thread(self.load_tokenizer)
        skipped = await asyncio.to_thread(tok.remember, strings)
        log.info("constraint catalog %s: %d strings tokenized in the server in %.2f s "
                 "(%d the tokenizer cannot reproduce, left out)", catalog, len(strings),
                 time.perf_counter() - start, skipped)

    @staticmethod
    async def _worker_remembers(worker: Any, catalog: Path) -> bool:
        """Whether the worker now holds `catalog`: it started with it, or learned it."""
        from podium.constraints.compile.process import WorkerGone

        if worker.starts == 0:
            worker.catalogs.append(catalog)  # the start reads it before it says ready
            return await worker.wait_ready()
        if not await worker.wait_ready():
            return False
        try:
            answer = await worker.remember(catalog)
        except WorkerGone:  # died meanwhile: its next start reads the file
            worker.catalogs.append(catalog)
            return False
        if "error" in answer:  # the server read the same file a moment ago: changed since
            raise PackageError(answer["error"], param=answer.get("param"))
        if "fault" in answer:
            raise RuntimeError(f"the constraint compile worker failed: {answer['fault']}")
        log.info("constraint catalog %s: %d strings tokenized in the running compile worker in "
                 "%.2f s (%d the tokenizer cannot reproduce, left out)", catalog,
                 answer["catalog"], answer["seconds"], answer["skipped"])
        return True

    def run(self, fn: Any, *args: Any) -> Future[Any]:
        """``fn(*args)`` in the compile pool, beside the compiles (the worker's late catalog)."""
        return self._pool.submit(fn, *args)

    def compile_now(self, normalized: dict[str, Any]) -> Precompiled:
        """The same, in the calling thread (tests, benchmarks, synchronous callers)."""
        start = time.perf_counter()
        result = self.submit(normalized).result()
        return Precompiled(result.key, time.perf_counter() - start, result.cached)

    def compile_here(self, normalized: dict[str, Any]) -> Precompiled:
        """Compile (or find) ``normalized`` in the calling thread, with no hand-over to the
        pool (the worker's one thread of compiles, in arrival order)."""
        return self._compile(normalized, _canonical(normalized))

    def shutdown(self) -> None:
        """Finish the compiles in flight; stop the worker process, if any."""
        self._pool.shutdown(wait=True)
        if self._worker is not None:
            self._worker.close()

    async def _compile_off_loop(self, normalized: dict[str, Any]) -> Precompiled:
        sent = self._for_worker(normalized)
        if sent is not None:
            from podium.constraints.compile.process import WorkerGone

            try:
                return await self._in_worker(*sent, normalized["type"])
            except WorkerGone:
                pass  # it died with this compile in flight: the pool compiles it
        return await asyncio.wrap_future(self.submit(normalized))

    def _for_worker(self, normalized: dict[str, Any]) -> tuple[str, bytes] | None:
        """The spec's canonical text and its UTF-8 bytes when the worker can take it now."""
        worker = self._worker
        if worker is None or normalized["type"] not in _builtin_names() or not worker.ready():
            return None
        canonical = _canonical(normalized)
        try:
            return canonical, canonical.encode()
        except UnicodeEncodeError:  # a lone surrogate: no UTF-8 line can carry it
            return None

    async def _in_worker(self, canonical: str, data: bytes, kind: str) -> Precompiled:
        """The form's key from the worker; identical specs in flight share one compile."""
        from podium.constraints.compile.store import form_key

        worker = self._worker
        key = form_key(worker.fingerprint, canonical)
        if self.store.has(key):
            return Precompiled(key, 0.0, True, "process")
        # a future per request, all resolved by the answer: one request that goes away
        # cancels its own, never the compile the others wait for
        mine: asyncio.Future[Precompiled] = asyncio.get_running_loop().create_future()
        waiters = self._asked.get(key)
        if waiters is None:
            self._asked[key] = waiters = [mine]
            try:
                worker.send(data, lambda answer: self._answered(key, kind, answer))
            except BaseException:
                del self._asked[key]
                raise
        else:
            waiters.append(mine)
        return await mine

    def _answered(self, key: str, kind: str, answer: Any) -> None:
        """The worker's answer for `key`, handed to every request waiting on it."""
        from podium.constraints.compile.process import WorkerGone

        waiters = self._asked.pop(key, [])
        result: Precompiled | BaseException
        if isinstance(answer, WorkerGone):
            result = answer
        elif "error" in answer:
            result = InvalidArgument(answer["error"], param=answer.get("param"))
        elif "fault" in answer:
            result = RuntimeError(f"the constraint compile worker failed: {answer['fault']}")
        else:
            tokenized = answer.get("tokenized", 0)
            if not answer["cached"]:
                _observe_work(kind, "process", answer["seconds"], tokenized)
            result = Precompiled(answer["key"], answer["seconds"], answer["cached"], "process",
                                 tokenized)
        for waiter in waiters:
            if waiter.done():
                continue
            if isinstance(result, BaseException):
                waiter.set_exception(result)
            else:
                waiter.set_result(result)

    def submit(self, normalized: dict[str, Any]) -> Future[Precompiled]:
        canonical = _canonical(normalized)
        with self._lock:
            fp = self._fingerprint
        if fp is not None:
            from podium.constraints.compile.store import form_key

            key = form_key(fp, canonical)
            if self.store.get(key) is not None:
                done: Future[Precompiled] = Future()
                done.set_result(Precompiled(key, 0.0, True))
                return done
        else:
            key = "first:" + canonical  # before the tokenizer is loaded: dedupe by text
        with self._lock:
            running = self._inflight.get(key)
            if running is not None:
                return running
            future = self._pool.submit(self._compile, normalized, canonical)
            self._inflight[key] = future
        future.add_done_callback(lambda _f: self._forget(key))
        return future

    def _forget(self, key: str) -> None:
        with self._lock:
            self._inflight.pop(key, None)

    def _compile(self, normalized: dict[str, Any], canonical: str) -> Precompiled:
        from podium.constraints.compile.store import form_key
        from podium.constraints.spec.registry import constraint_type

        tok, fp = self.load_tokenizer()
        key = form_key(fp, canonical)
        if self.store.get(key) is not None:
            return Precompiled(key, 0.0, True)
        ct = constraint_type(normalized["type"])
        if ct is None:
            raise InvalidArgument(f"unknown constraint type {normalized['type']!r}",
                                  param="constraint.type")
        start = time.perf_counter()
        tok.tokenized_here()  # counted from here
        try:
            constraint = ct.compile(normalized, tok)
            form = constraint.lower(key=key, vocab_size=tok.vocab_size,
                                    eos_token_ids=tok.eos_token_ids)
        except InvalidArgument:
            raise
        except Exception as exc:  # a string the tokenizer cannot produce, a plugin's verdict
            raise InvalidArgument(f"constraint ({normalized['type']}) cannot be compiled for "
                                  f"this model's tokenizer: {exc}", param="constraint") from None
        if form is None:
            return Precompiled(None, 0.0, False)  # a plugin with Python state: engine-side
        form.compile_seconds = time.perf_counter() - start
        tokenized = tok.tokenized_here()
        if self._observe:
            _observe_work(normalized["type"], "thread", form.compile_seconds, tokenized)
        self.store.put(form)
        return Precompiled(key, form.compile_seconds, False, tokenized=tokenized)


@cache
def precompiler_for(tokenizer: str, vocab_size: int) -> ConstraintPrecompiler:
    """The process's precompiler for one tokenizer (one pool and one cache per model)."""
    return ConstraintPrecompiler(tokenizer, vocab_size)


async def precompile_xargs(xargs: dict[str, Any] | None, model_config: Any) -> float | None:
    """Compile the constraint that ``xargs`` (from ``admit_constraint``) carries and add its
    key; the seconds this request spent compiling, or None when it has no constraint."""
    if not xargs or XARGS_KEY not in xargs:
        return None
    tokenizer = getattr(model_config, "tokenizer", None)
    if tokenizer is None:  # an engine without a tokenizer folder (a test fake): engine-side
        return None
    normalized = json.loads(xargs[XARGS_KEY])
    compiler = precompiler_for(str(tokenizer), int(model_config.get_vocab_size()))
    result = await compiler.compile(normalized)
    if result.key is not None:
        xargs[KEY_XARGS] = result.key
    return result.seconds


def _canonical(normalized: dict[str, Any]) -> str:
    """The spec's one text (what its key hashes)."""
    return json.dumps(normalized, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


@cache
def _builtin_names() -> frozenset[str]:
    """Types the worker process compiles; a plugin's compile stays in the server's threads."""
    from podium.constraints.spec.builtins import BUILTIN_TYPES

    return frozenset(ct.name for ct in BUILTIN_TYPES)


def _fingerprint(tok: Any) -> str:
    """What identifies a tokenizer for compiled forms: its vocabulary, merges and EOS."""
    h = hashlib.sha256()
    backend = getattr(tok.tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:
        h.update(json.dumps(sorted(tok.tokenizer.get_vocab().items())).encode())
    h.update(json.dumps([tok.vocab_size, list(tok.eos_token_ids)]).encode())
    return h.hexdigest()


def _observe(kind: str, cached: bool, compiler: str, seconds: float) -> None:
    from podium.metrics.server import observe_constraint_compile

    observe_constraint_compile(kind, cached, compiler, seconds)


def _observe_work(kind: str, compiler: str, seconds: float, tokenized: int) -> None:
    from podium.metrics.server import observe_constraint_compile_work

    observe_constraint_compile_work(kind, compiler, seconds, tokenized)
