"""The control plane's internal credential: the one key its instances accept.

`podium up` makes one per home the first time it starts (`secrets.token_urlsafe(32)`, 256 bits)
and keeps it in `$PODIUM_HOME/secrets/internal.key`, a file created with mode 0600 before a
byte is written (so it is never readable by others, not even for a moment) and reused on every
restart, so instances that outlived a control plane keep accepting its successor. It reaches an
instance through the environment (`PODIUM_INTERNAL_KEY`), which `podium serve` takes out of its
own environment at once, so no child (engine, backend) inherits it; it is never on a command
line and never logged. The gateway and the control plane send it on every call to an instance.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from podium.errors import InvalidArgument

ENV = "PODIUM_INTERNAL_KEY"
"""Environment variable that hands the credential to an instance."""
RELATIVE_PATH = Path("secrets") / "internal.key"
"""Where the credential lives under PODIUM_HOME."""


def path_in(home: Path) -> Path:
    """The credential file of the control plane whose home is `home`."""
    return home / RELATIVE_PATH


def load_or_create(home: Path) -> str:
    """The home's credential: read when it exists (refused when others can read it), else
    made and stored atomically with mode 0600."""
    path = path_in(home)
    try:
        return read(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    credential = secrets.token_urlsafe(32)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    # O_EXCL + mode 0600: the file is private from the moment it exists (the umask can only
    # narrow it), written in full, then linked into place: a reader sees all of it or nothing
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as file:
            file.write(credential + "\n")
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(temporary, path)  # fails if another process made one first: use theirs
        except FileExistsError:
            return read(path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    return credential


def read(path: Path) -> str:
    """The credential stored at `path`; refused when the file is open to group or others."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, encoding="ascii") as file:
        mode = os.fstat(file.fileno()).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise InvalidArgument(
                f"the internal credential {str(path)!r} is readable by others (mode "
                f"{stat.S_IMODE(mode):o}); run `chmod 600 {path}` and restart (deleting it "
                "makes a new one, which instances still running from before refuse)", param="home")
        credential = file.read().strip()
    if not credential:
        raise InvalidArgument(f"the internal credential {str(path)!r} is empty; delete it and "
                              "restart `podium up` to make a new one", param="home")
    return credential


def instance_env(credential: str | None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment an instance starts with: the credential in, and none of the operator's
    own keys, so an instance accepts the control plane's credential only."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in ("PODIUM_API_KEY", "PODIUM_ADMIN_KEY", ENV)}
    if credential:
        env[ENV] = credential
    return env


def bearer(credential: str | None) -> dict[str, str]:
    """The Authorization header carrying `credential` (none without one)."""
    return {"Authorization": f"Bearer {credential}"} if credential else {}
