"""What the CLI does with answers that are not the API's JSON, and with a deploy whose first
step fails after the rollout was stored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from podium.control.actions import Action, Scale
from podium.control.api import create_app
from podium.control.plane import ControlPlane
from podium.control.store import Store
from tests.support.control_cli import podium
from tests.support.fake_world import FakeWorld
from tests.support.servers import Served


def _package(root: Path, version: str) -> Path:
    folder = root / f"iris-{version}"
    folder.mkdir()
    (folder / "podium.json").write_text(json.dumps(
        {"name": "iris", "version": version, "backend": "python"}))
    return folder


def _answering(status: int, body: bytes, media_type: str | None) -> Starlette:
    """A stand-in for whatever sits at the API's address: one fixed answer to everything."""
    async def answer(_request: Request) -> Response:
        return Response(body, status_code=status, media_type=media_type)

    return Starlette(routes=[Route("/{path:path}", answer, methods=["GET", "POST", "PUT"])])


@pytest.mark.parametrize(("status", "body", "media_type", "code", "shown"), [
    (500, b"Internal Server Error", "text/plain", 1, "500 Internal Server Error with a "
     "non-JSON body (text/plain; charset=utf-8): Internal Server Error"),
    (502, b"<html><body>Bad Gateway</body></html>", "text/html", 1,
     "502 Bad Gateway with a non-JSON body (text/html; charset=utf-8): <html>"),
    (404, b"", None, 2, "404 Not Found with a non-JSON body (no content type): (empty)"),
    (201, b"", None, 0, "201 Created with a non-JSON body (no content type): (empty); the "
     "request was accepted: check it with `podium status`"),
], ids=["plain-500", "html-502", "empty-404", "empty-201"])
def test_a_non_json_answer_is_shown_with_its_status_not_a_traceback(
        capsys: pytest.CaptureFixture[str], status: int, body: bytes, media_type: str | None,
        code: int, shown: str) -> None:
    served = Served(_answering(status, body, media_type))
    try:
        assert podium("deploy", "iris@1", "--api", served.url) == code
    finally:
        served.stop()
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    printed = captured.err if code else captured.out
    assert f"podium: POST /v1/rollouts answered {shown}" in printed


class FailingOnce(FakeWorld):
    """A world whose first scale fails (a runtime that could not start a process)."""

    failed = False

    def apply(self, actions: list[Action]) -> None:
        if not self.failed and any(isinstance(a, Scale) and a.count for a in actions):
            self.failed = True
            raise OSError(24, "Too many open files")
        super().apply(actions)


def test_deploy_whose_first_step_fails_answers_the_created_rollout(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The rollout is stored before its first step: a failing step is retried by the loop,
    and `podium deploy` exits 0 naming the rollout instead of reporting a failure."""
    world = FailingOnce()
    store = Store.open(f"sqlite:///{tmp_path / 'c.db'}")
    plane = ControlPlane(store, world, clock=lambda: world.now_ms, materialize=lambda _p: None)
    served = Served(create_app(plane))
    try:
        assert podium("announce", str(_package(tmp_path, "1")), "--api", served.url) == 0
        assert podium("deploy", "iris@1", "--stages", "100", "--api", served.url) == 0
        assert "#1 iris - -> 1 red-black running" in capsys.readouterr().out
        assert world.failed and world.count("iris", "1") == 0
        assert any("first step failed (OSError" in e.message for e in store.list_events())
        plane.tick()  # the loop's next pass: the stored step is applied again
        assert world.count("iris", "1") == 1
        assert podium("rollouts", "--api", served.url, "--json") == 0
        assert [r["id"] for r in json.loads(capsys.readouterr().out)] == [1]
    finally:
        served.stop()
        store.close()
