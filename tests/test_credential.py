"""The control plane's internal credential: private from birth, reused, refused when open."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from podium import credential
from podium.errors import InvalidArgument


def test_made_once_with_mode_0600_and_reused(tmp_path: Path) -> None:
    old = os.umask(0)  # even a permissive umask cannot widen it
    try:
        made = credential.load_or_create(tmp_path)
    finally:
        os.umask(old)
    path = credential.path_in(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert len(made) >= 43  # 32 random bytes, URL-safe base64
    assert credential.load_or_create(tmp_path) == made  # a restarted plane keeps it
    assert [p.name for p in path.parent.iterdir()] == ["internal.key"]  # no temporary left
    assert credential.load_or_create(tmp_path / "other") != made  # one per control plane


def test_a_credential_others_can_read_is_refused_with_the_fix(tmp_path: Path) -> None:
    credential.load_or_create(tmp_path)
    path = credential.path_in(tmp_path)
    path.chmod(0o644)
    with pytest.raises(InvalidArgument, match=f"readable by others.*chmod 600 {path}"):
        credential.load_or_create(tmp_path)
    path.chmod(0o600)
    assert credential.load_or_create(tmp_path)


def test_instances_get_the_credential_and_none_of_the_operators_keys() -> None:
    env = credential.instance_env("c", {"PATH": "/bin", "PODIUM_API_KEY": "user",
                                        "PODIUM_ADMIN_KEY": "admin"})
    assert env == {"PATH": "/bin", "PODIUM_INTERNAL_KEY": "c"}
    assert credential.bearer("c") == {"Authorization": "Bearer c"}
    assert credential.bearer(None) == {}


def test_podium_serve_takes_the_credential_out_of_its_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from podium import env

    monkeypatch.setenv(credential.ENV, "secret")
    assert env.take_internal_key() == "secret"
    assert credential.ENV not in os.environ  # no engine or backend child inherits it
    assert env.take_internal_key() is None
