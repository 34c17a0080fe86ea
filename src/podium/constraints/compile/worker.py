"""The constraint compile worker: a process of its own that compiles specs for one tokenizer.

The server's event loop holds its GIL for most of every step it serves, so a compile in one of
its threads waits for that GIL at every release. Here the compile has a GIL of its own:
measured (``bench/constraints_gil.py``), a 500-candidate spec that compiles in 2.1 ms alone took
107 ms (p50) in a server thread beside one busy Python thread, and 11.8 ms here.
:class:`~podium.constraints.compile.process.CompileProcess` starts this module as
``python -m podium.constraints.compile.worker`` and speaks to it over its standard streams, one
msgspec JSON message a line:

- worker → server, once, when it is ready (its catalogs tokenized):
  ``{"ready": <tokenizer fingerprint>, "catalog": strings, "skipped": n, "seconds": s}``;
- server → worker: ``{"id": n, "spec": <normalized spec>}``, or ``{"id": n, "catalog":
  <path>}`` for a catalog given after the worker started (a second package of the same
  tokenizer: another version loaded beside the first);
- worker → server, one per request, in any order: ``{"id": n, "key": k, "seconds": s,
  "cached": b, "tokenized": strings}`` (a catalog: ``{"id": n, "catalog": strings, "skipped":
  n, "seconds": s}``), or ``{"id": n, "error": message, "param": field}`` for a spec or catalog
  that is refused (the request's 400), or ``{"id": n, "fault": text}`` for a fault of ours.

The worker compiles with :class:`~podium.constraints.compile.precompile.ConstraintPrecompiler` (the
host's store), so a form it publishes is the one the server's own threads would have made. It
compiles in the thread that reads its input, in arrival order: a hand-over to a pool thread
was one more wake-up per compile, on a host whose cores the engine keeps busy. A late
catalog is tokenized in a pool thread, so compiles go on meanwhile, and so is a ``regex``,
whose compile may take seconds. It exits when its input
closes: when the server exits, however it exits. Only built-in constraint types come here; a
plugin registered in the server compiles there.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from podium.errors import InvalidArgument, PackageError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m podium.constraints.compile.worker")
    ap.add_argument("--tokenizer", required=True, help="the model's tokenizer folder")
    ap.add_argument("--vocab-size", type=int, required=True, help="the model's logits width")
    ap.add_argument("--directory", required=True, help="the host's compiled-form directory")
    ap.add_argument("--catalog", action="append", default=[], type=Path,
                    help="a package's constraint_catalog file, tokenized before ready (repeat)")
    args = ap.parse_args(argv)
    # the protocol gets a descriptor of its own; anything a library prints goes to stderr
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    from podium.constraints import kernels
    from podium.constraints.compile.precompile import ConstraintPrecompiler
    from podium.constraints.compile.store import FormStore

    compiler = ConstraintPrecompiler(args.tokenizer, args.vocab_size,
                                     store=FormStore(Path(args.directory)), process=False,
                                     observe=False)
    tok, fingerprint = compiler.load_tokenizer()
    kernels.warm()
    ready = {"ready": fingerprint, **_remember(tok, args.catalog)}
    send = _Sender(out)
    send(ready)
    decode = msgspec.json.Decoder().decode
    for line in sys.stdin.buffer:
        try:
            message = decode(line)
            rid = message["id"]
        except (msgspec.DecodeError, KeyError, TypeError) as exc:  # the server's bug
            print(f"podium compile worker: unreadable request: {exc}", file=sys.stderr)
            return 2  # the server then compiles what was in flight itself
        try:
            if "catalog" in message:  # in a pool thread: compiles go on meanwhile
                future = compiler.run(_remember, tok, [Path(message["catalog"])])
            elif message["spec"].get("type") == "regex":
                # may take seconds (bounded in podium.constraints.compile.regex): in a pool thread,
                # so the candidate sets behind it do not wait for it
                future = compiler.submit(message["spec"])
            else:  # here: a hand-over to a pool thread is one more wake-up on a busy host
                future = Future()
                future.set_result(compiler.compile_here(message["spec"]))
        except Exception as exc:  # any failure is this request's answer
            future = Future()
            future.set_exception(exc)
        future.add_done_callback(lambda f, rid=rid: send(_answer(rid, f)))
    compiler.shutdown()
    return 0


def _remember(tok: Any, catalogs: list[Path]) -> dict[str, Any]:
    """Tokenize the catalogs' strings (a bad file fails the start: the server checked it at
    boot, so that is a file changed since); what the ready line says of them."""
    from podium.package.catalog import read_catalog

    start = time.perf_counter()
    strings = [s for path in catalogs for s in read_catalog(path, path.parent)]
    skipped = tok.remember(strings) if strings else 0
    return {"catalog": len(strings), "skipped": skipped,
            "seconds": round(time.perf_counter() - start, 3)}


def _answer(rid: int, future: Future[Any]) -> dict[str, Any]:
    exc = future.exception()
    if exc is None:
        done = future.result()
        if isinstance(done, dict):  # a catalog's
            return {"id": rid, **done}
        return {"id": rid, "key": done.key, "seconds": done.seconds, "cached": done.cached,
                "tokenized": done.tokenized}
    if isinstance(exc, InvalidArgument | PackageError):
        return {"id": rid, "error": exc.message, "param": exc.param}
    return {"id": rid, "fault": f"{type(exc).__name__}: {exc}"}


class _Sender:
    """Whole lines to the server, one writer at a time (a late catalog's answer comes from a
    pool thread)."""

    def __init__(self, out: BinaryIO) -> None:
        self._out, self._lock = out, threading.Lock()
        self._encode = msgspec.json.Encoder().encode

    def __call__(self, message: dict[str, Any]) -> None:
        data = self._encode(message) + b"\n"
        with self._lock:
            self._out.write(data)


if __name__ == "__main__":
    sys.exit(main())
