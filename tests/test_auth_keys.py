"""Keys per role, several per role, key files rotated without a restart, constant time."""

from __future__ import annotations

import hmac
import os
from pathlib import Path

import pytest

from podium.auth_keys import ADMIN, INFERENCE, ApiKeys, KeyConfig, KeyFile
from podium.errors import Unauthorized


def _accepts(config: KeyConfig, role: str, key: str) -> bool:
    try:
        config.access().check(role, f"Bearer {key}", how="it")
    except Unauthorized:
        return False
    return True


SPLIT = KeyConfig(api_keys=("infer-1", "infer-2"), admin_keys=("admin-1", "admin-2"),
                  internal_key="internal")


@pytest.mark.parametrize(("config", "role", "key", "ok"), [
    (SPLIT, INFERENCE, "infer-1", True),
    (SPLIT, INFERENCE, "infer-2", True),
    (SPLIT, INFERENCE, "admin-1", False),
    (SPLIT, ADMIN, "admin-2", True),
    (SPLIT, ADMIN, "infer-1", False),
    (SPLIT, INFERENCE, "internal", True),
    (SPLIT, ADMIN, "internal", True),
    (KeyConfig(api_keys=("only",)), ADMIN, "only", True),
    (KeyConfig(api_keys=("only",)), INFERENCE, "other", False),
    (KeyConfig(internal_key="internal"), INFERENCE, "anything", False),
    (KeyConfig(admin_keys=("a",)), INFERENCE, "anything", True),
    (KeyConfig(admin_keys=("a",)), ADMIN, "anything", False),
], ids=["inference-key-1", "inference-key-2", "admin-key-not-for-inference",
        "admin-key-2", "inference-key-not-for-admin", "internal-for-inference",
        "internal-for-admin", "one-key-opens-both-without-admin-keys", "wrong-key",
        "internal-only-refuses-others", "admin-only-leaves-inference-open",
        "admin-only-guards-admin"])
def test_each_role_takes_its_own_keys(config: KeyConfig, role: str, key: str,
                                      ok: bool) -> None:
    assert _accepts(config, role, key) is ok


def test_a_refusal_names_the_role_and_its_flags_never_the_keys() -> None:
    with pytest.raises(Unauthorized) as err:
        SPLIT.access().check(ADMIN, "Bearer infer-1", how="the header")
    message = err.value.message
    assert "API key wrong" in message and "admin key" in message
    assert "--admin-key / --admin-key-file" in message
    assert not any(key in message for key in ("infer-1", "admin-1", "internal"))
    with pytest.raises(Unauthorized, match=r"API key missing.*inference key"):
        SPLIT.access().check(INFERENCE, None, how="the header")


def test_the_internal_key_is_never_shown() -> None:
    assert "internal" not in repr(SPLIT)


def _rewrite(path: Path, text: str) -> None:
    """Replace the file as an operator should: a new file renamed over the old one."""
    new = path.with_suffix(".new")
    new.write_text(text)
    os.replace(new, path)


def test_a_key_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# rotated monthly\nold-key\n\n  spare-key  \n")
    config = KeyConfig(api_key_files=(path,), admin_keys=("admin",))
    access = config.access()  # built once, as a server does

    def ok(key: str) -> bool:
        try:
            access.check(INFERENCE, f"Bearer {key}", how="it")
        except Unauthorized:
            return False
        return True

    assert ok("old-key") and ok("spare-key") and not ok("new-key")
    assert not ok("# rotated monthly")  # comments are not keys
    _rewrite(path, "old-key\nnew-key\n")  # step 1: add the new key beside the old
    assert ok("old-key") and ok("new-key") and not ok("spare-key")
    _rewrite(path, "new-key\n")  # step 2: clients moved; drop the old one
    assert ok("new-key") and not ok("old-key")
    path.unlink()  # mid-replacement (or removed by mistake): the last keys stay
    assert ok("new-key") and not ok("old-key")


def test_an_in_place_rewrite_of_the_same_size_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("key-a\n")
    keys = KeyFile(path)
    assert keys.current() == ["key-a"]
    path.write_text("key-b\n")  # same size, same inode: the mtime tells
    os.utime(path, ns=(1, 1))
    assert keys.current() == ["key-b"]


def test_a_missing_key_file_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cannot be read.*one key per line"):
        KeyConfig(api_key_files=(tmp_path / "nope",)).access()


def test_every_key_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("file-1\nfile-2\n")
    keys = ApiKeys(["lit-1", "lit-2"], files=[path])
    compared: list[bytes] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append(b)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert keys.matches("Bearer lit-1")  # the first key matches: the others are still compared
    assert compared == [b"Bearer lit-1", b"Bearer lit-2", b"Bearer file-1", b"Bearer file-2"]
    compared.clear()
    assert not keys.matches("Bearer nope")
    assert len(compared) == 4
