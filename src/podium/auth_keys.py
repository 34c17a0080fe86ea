"""Which keys a server accepts, per role, and how they rotate without a restart.

Two roles: `inference` (OpenAI /v1, KServe /v2 data routes, readiness, metadata) and `admin`
(model repository load/unload/index, /metrics, the control-plane API). A key is given literally
(`--api-key`, repeatable) or in a file of keys, one per line (`--api-key-file`); a file is read
again whenever its modification time, size or inode change, so writing a new file (best:
rename a new one over it) rotates keys on a running server. Every accepted key is compared in
constant time against what was sent, so the time taken does not tell which key nearly matched.

Defaults: with no admin key configured, the inference keys also open the admin routes (one key
for everything, as `--api-key` always meant); configure an admin key and the two are separate.
A server with no key at all is open. The control plane's internal credential (`credential.py`)
is accepted for both roles.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from podium.errors import Unauthorized

log = logging.getLogger("podium.auth")
INFERENCE, ADMIN = "inference", "admin"
ROLES = (INFERENCE, ADMIN)
_FLAGS = {INFERENCE: "--api-key / --api-key-file", ADMIN: "--admin-key / --admin-key-file"}


def read_key_file(path: Path) -> list[str]:
    """The keys in `path`: one per line, blank lines and `#` comments skipped."""
    keys = []
    for line in path.read_text(encoding="utf-8").splitlines():
        key = line.strip()
        if key and not key.startswith("#"):
            keys.append(key)
    return keys


class KeyFile:
    """A file of keys, re-read when it changes (checked at most every `recheck_s`)."""

    def __init__(self, path: Path, *, recheck_s: float = 0.0) -> None:
        self.path = Path(path)
        self.recheck_s = recheck_s
        try:
            self._stamp = self._stat()
            self._keys = read_key_file(self.path)
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"key file {str(self.path)!r} cannot be read ({exc}); give a "
                             "readable file with one key per line") from None
        self._lock = threading.Lock()

    def _stat(self) -> tuple[int, int, int]:
        st = os.stat(self.path)
        return st.st_mtime_ns, st.st_size, st.st_ino

    def current(self) -> list[str]:
        """The file's keys now: re-read when its stamp changed since the last read."""
        try:
            stamp = self._stat()
        except OSError:
            return self._keys  # mid-replacement or removed: keep the last keys read
        if stamp == self._stamp:
            return self._keys
        with self._lock:
            try:
                keys = read_key_file(self.path)
            except (OSError, UnicodeDecodeError) as exc:
                log.warning("key file %s cannot be read (%s); keeping its previous %d key(s)",
                            self.path, exc, len(self._keys))
                return self._keys
            if keys != self._keys:
                log.info("key file %s changed: %d key(s) now", self.path, len(keys))
            self._stamp, self._keys = stamp, keys
        return self._keys


class ApiKeys:
    """The keys one role accepts; `check` raises Unauthorized for anything else."""

    def __init__(self, keys: str | Sequence[str] = (), *, files: Iterable[Path | KeyFile] = (),
                 role: str = INFERENCE) -> None:
        keys = [keys] if isinstance(keys, str) else list(keys)
        if not all(keys):
            raise ValueError("an API key must be a non-empty string")
        self.role = role
        self.files = [f if isinstance(f, KeyFile) else KeyFile(Path(f)) for f in files]
        if not keys and not self.files:
            raise ValueError("give at least one key or key file")
        self._literal = [_bearer(key) for key in keys]
        self._from_files: tuple[tuple[str, ...], list[bytes]] = ((), [])

    def expected(self) -> list[bytes]:
        """Every `Bearer <key>` value accepted right now."""
        if not self.files:
            return self._literal
        current = tuple(key for f in self.files for key in f.current())
        if current != self._from_files[0]:
            self._from_files = (current, [_bearer(key) for key in current])
        return self._literal + self._from_files[1]

    def matches(self, given: str | bytes | None) -> bool:
        """Whether `given` (an Authorization value) is one of the keys, in constant time."""
        value = given.encode() if isinstance(given, str) else given or b""
        # every key is compared, so the time taken does not tell which one nearly matched
        matched = [hmac.compare_digest(value, expected) for expected in self.expected()]
        return any(matched)

    def check(self, given: str | bytes | None, *, how: str) -> None:
        """Accept `given` (the Authorization value) or raise Unauthorized saying `how` to send
        a key."""
        if not self.matches(given):
            raise _refusal(given, how, self.role)


def _bearer(key: str) -> bytes:
    return f"Bearer {key}".encode()


def _refusal(given: str | bytes | None, how: str, role: str) -> Unauthorized:
    reason = "missing" if not given else "wrong"
    return Unauthorized(f"API key {reason}: send {how} with an {role} key the server was "
                        f"started with ({_FLAGS[role]})")


@dataclass(frozen=True)
class KeyConfig:
    """The keys a server was started with (flags, files, the internal credential)."""

    api_keys: tuple[str, ...] = ()
    """Inference keys given literally (`--api-key`, repeatable; env PODIUM_API_KEY)."""
    api_key_files: tuple[Path, ...] = ()
    """Files of inference keys, one per line, re-read when changed."""
    admin_keys: tuple[str, ...] = ()
    """Admin keys given literally (`--admin-key`, repeatable; env PODIUM_ADMIN_KEY)."""
    admin_key_files: tuple[Path, ...] = ()
    """Files of admin keys, one per line, re-read when changed."""
    internal_key: str | None = field(default=None, repr=False)
    """The control plane's credential: accepted for every role, never shown."""

    @property
    def has_admin_keys(self) -> bool:
        return bool(self.admin_keys or self.admin_key_files)

    def access(self) -> Access:
        """The per-role key sets these settings mean."""
        internal = [self.internal_key] if self.internal_key else []
        files = [KeyFile(p) for p in self.api_key_files]  # one reader shared by both roles
        inference = _keys([*self.api_keys, *internal], files, INFERENCE)
        if self.has_admin_keys:
            admin = _keys([*self.admin_keys, *internal],
                          [KeyFile(p) for p in self.admin_key_files], ADMIN)
        else:  # one key for everything, as --api-key always meant
            admin = _keys([*self.api_keys, *internal], files, ADMIN)
        return Access({INFERENCE: inference, ADMIN: admin})


def _keys(keys: list[str], files: list[KeyFile], role: str) -> ApiKeys | None:
    return ApiKeys(keys, files=files, role=role) if keys or files else None


@dataclass(frozen=True)
class Access:
    """Per role, the keys accepted; a role without keys is open."""

    roles: dict[str, ApiKeys | None]

    @classmethod
    def single(cls, keys: str | Sequence[str]) -> Access:
        """Every role takes the same keys (a server started with just `--api-key`)."""
        return KeyConfig(api_keys=(keys,) if isinstance(keys, str) else tuple(keys)).access()

    @property
    def guarded(self) -> bool:
        """Whether any role needs a key."""
        return any(keys is not None for keys in self.roles.values())

    def allows(self, role: str, given: str | bytes | None) -> bool:
        """Whether `given` (an Authorization value) passes `role`; always for an open role."""
        keys = self.roles.get(role)
        return keys is None or keys.matches(given)

    def check(self, role: str, given: str | bytes | None, *, how: str) -> None:
        """Accept `given` for `role` or raise Unauthorized."""
        keys = self.roles.get(role)
        if keys is not None:
            keys.check(given, how=how)
