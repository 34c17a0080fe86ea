"""The content-hash cache of compiled constraints, shared by every process of a host.

The frontend compiles a spec and ``put``s its form under the key
``sha256(tokenizer fingerprint, normalized spec)``; the request carries only the key to the
engine, whose processor ``get``s the form: from its own memory if a request already brought it,
else by reading one file from the host's directory (``PODIUM_CONSTRAINT_CACHE``, in
``/dev/shm`` by default). Files are written whole and renamed into place, so a reader never
sees half a form; instances of one model on a host share them.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path

from podium.constraints.compile.form import CompiledForm, from_buffer

log = logging.getLogger(__name__)

_SUFFIX = ".form"
SCAN_EVERY_PUTS = 4096
"""A scan of the directory at least this often (other processes write to it too); else only
when this store's count says the directory may be over its budget."""
TRIM_TO = 0.9
"""A trim leaves the directory at this share of its budget."""


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
        self._scanned: int | None = None  # the directory's bytes at the last scan (None: none)
        self._written = 0  # bytes this store has written, ever
        self._written_at_scan = 0

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

    def has(self, key: str) -> bool:
        """Whether ``key``'s form is here or in the host's directory (not read)."""
        with self._lock:
            if key in self._memory:
                return True
        return _is_key(key) and (self.directory / (key + _SUFFIX)).exists()

    def put(self, form: CompiledForm) -> None:
        """Keep ``form`` here and publish it to the host's directory."""
        self._remember(form)
        path = self.directory / (form.key + _SUFFIX)
        if path.exists():
            return
        data = form.to_bytes()
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = path.with_name(f".{form.key}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except OSError as exc:
            # the engine then compiles the spec itself (counted): slower, never wrong
            log.warning("cannot publish a compiled constraint to %s: %s", self.directory, exc)
            return
        with self._lock:
            self._puts += 1
            self._written += len(data)
            due = self._over_budget() or self._puts % SCAN_EVERY_PUTS == 0
        if due and self._trimming.acquire(blocking=False):
            # a scan (a stat per file: 6 ms at 1,000 forms on tmpfs) is no request's to wait
            # for: it runs beside the compiles, one at a time, and holds the GIL while it
            # runs, so it runs only when the directory may be over its budget
            threading.Thread(target=self._trim_then_release, name="podium-form-trim",
                             daemon=True).start()

    def _remember(self, form: CompiledForm) -> None:
        with self._lock:
            self._memory[form.key] = form
            self._memory.move_to_end(form.key)
            while len(self._memory) > self.capacity:
                self._memory.popitem(last=False)

    def _over_budget(self) -> bool:
        """Whether the directory may be past its budget: never scanned, or its size at the
        last scan plus what this store wrote since is (other processes' writes are seen by
        the next scan)."""
        return (self._scanned is None
                or self._scanned + self._written - self._written_at_scan > self.max_dir_bytes)

    def _trim_then_release(self) -> None:
        while True:
            try:
                self._trim()
            finally:
                self._trimming.release()
            # a put that found this scan running left its bytes to it: count them once more
            with self._lock:
                again = self._written > self._written_at_scan and self._over_budget()
            if not again or not self._trimming.acquire(blocking=False):
                return

    def _trim(self) -> None:
        """Past ``max_dir_bytes``, drop the oldest files down to ``TRIM_TO`` of it (a request
        then recompiles them), so the next scan is due only after that much more is
        written."""
        with self._lock:
            mark = self._written
        files = []
        try:
            with os.scandir(self.directory) as entries:
                for entry in entries:
                    if entry.name.endswith(_SUFFIX):
                        with contextlib.suppress(FileNotFoundError):  # another's trim
                            st = entry.stat()
                            files.append((st.st_mtime, st.st_size, entry.path))
        except OSError:
            return
        total = sum(size for _, size, _ in files)
        if total > self.max_dir_bytes:
            for _, size, path in sorted(files):
                if total <= self.max_dir_bytes * TRIM_TO:
                    break
                with contextlib.suppress(OSError):
                    os.unlink(path)
                total -= size
        with self._lock:
            self._scanned, self._written_at_scan = total, mark


def _is_key(key: str) -> bool:
    return len(key) == 40 and all(c in "0123456789abcdef" for c in key)
