"""The content-hash cache of compiled constraints, shared by every process of a host.

The frontend compiles a spec and ``put``s its form under the key
``sha256(tokenizer fingerprint, normalized spec)``; the request carries only the key to the
engine, whose processor ``get``s the form: from its own memory if a request already brought it,
else by reading one file from the host's directory (``PODIUM_CONSTRAINT_CACHE``, in
``/dev/shm`` by default). Files are written whole and renamed into place, so a reader never
sees half a form; instances of one model on a host share them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path

from podium.constraints.compiled import CompiledForm, from_buffer

log = logging.getLogger(__name__)

_SUFFIX = ".form"


def form_key(tokenizer_fingerprint: str, normalized_json: str) -> str:
    """The content hash naming the compiled form of a spec for one tokenizer."""
    h = hashlib.sha256(tokenizer_fingerprint.encode())
    h.update(b"\0")
    h.update(normalized_json.encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:40]


class FormStore:
    """Compiled forms by key: an in-process LRU in front of a host-wide directory."""

    def __init__(self, directory: Path | None = None, *, capacity: int = 1024,
                 max_dir_bytes: int = 2 << 30) -> None:
        if directory is None:
            from podium.env import constraint_cache_dir

            directory = constraint_cache_dir()
        self.directory = Path(directory)
        self.capacity = capacity
        self.max_dir_bytes = max_dir_bytes
        self._memory: OrderedDict[str, CompiledForm] = OrderedDict()
        self._lock = threading.Lock()
        self._puts = 0
        self._trimming = threading.Lock()  # held while a trim runs

    def get(self, key: str) -> CompiledForm | None:
        """The form named ``key``, or None if no process of this host compiled it."""
        with self._lock:
            form = self._memory.get(key)
            if form is not None:
                self._memory.move_to_end(key)
                return form
        if not _is_key(key):
            return None  # never a path outside the directory
        path = self.directory / (key + _SUFFIX)
        try:
            with open(path, "rb") as f:
                buf = bytearray(os.fstat(f.fileno()).st_size)
                f.readinto(buf)
            form = from_buffer(buf)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError):
            log.warning("unreadable compiled constraint %s; it will be compiled again", path)
            return None
        if form.key != key:
            return None
        self._remember(form)
        return form

    def put(self, form: CompiledForm) -> None:
        """Keep ``form`` here and publish it to the host's directory."""
        self._remember(form)
        path = self.directory / (form.key + _SUFFIX)
        if path.exists():
            return
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = path.with_name(f".{form.key}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_bytes(form.to_bytes())
            os.replace(tmp, path)
        except OSError as exc:
            # the engine then compiles the spec itself (counted): slower, never wrong
            log.warning("cannot publish a compiled constraint to %s: %s", self.directory, exc)
            return
        self._puts += 1
        if self._puts % 256 == 0 and self._trimming.acquire(blocking=False):
            # a directory scan (a stat per file: ~13 ms at 700 forms) is no request's to wait
            # for: it runs beside the compiles, one at a time
            threading.Thread(target=self._trim_then_release, name="podium-form-trim",
                             daemon=True).start()

    def _remember(self, form: CompiledForm) -> None:
        with self._lock:
            self._memory[form.key] = form
            self._memory.move_to_end(form.key)
            while len(self._memory) > self.capacity:
                self._memory.popitem(last=False)

    def _trim_then_release(self) -> None:
        try:
            self._trim()
        finally:
            self._trimming.release()

    def _trim(self) -> None:
        """Drop the oldest files past ``max_dir_bytes`` (a request then recompiles them)."""
        try:
            files = [(p.stat().st_mtime, p.stat().st_size, p)
                     for p in self.directory.glob("*" + _SUFFIX)]
        except OSError:
            return
        total = sum(size for _, size, _ in files)
        for _, size, p in sorted(files):
            if total <= self.max_dir_bytes:
                break
            p.unlink(missing_ok=True)
            total -= size


def _is_key(key: str) -> bool:
    return len(key) == 40 and all(c in "0123456789abcdef" for c in key)
