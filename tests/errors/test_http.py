"""A bug anywhere in an instance's HTTP app is a 500 naming the request id, never its text."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from podium.server.app import build_app
from podium.server.config import ServerConfig
from podium.server.instance import Instance
from tests.support.fake_backends import FakeLlmBackend, add_ready

GOOD = {"model": "fake-llm", "messages": [{"role": "user", "content": "hello"}]}


def _boom(*_args: Any, **_kwargs: Any) -> Any:
    raise RuntimeError("password=hunter2")


# where the bug is, the request that meets it, the error's shape
CASES = [
    pytest.param(lambda i, b: setattr(b.chat, "create_chat_completion", _boom),
                 ("POST", "/v1/chat/completions", GOOD), "openai", id="openai-route"),
    pytest.param(lambda i, b: setattr(i.repository, "index", _boom),
                 ("POST", "/v2/repository/index", {}), "kserve", id="kserve-route"),
    pytest.param(lambda i, b: setattr(i, "status", _boom),
                 ("GET", "/health/ready", None), "kserve", id="app-route"),
]


@pytest.mark.parametrize(("plant", "request_args", "shape"), CASES)
async def test_a_bug_is_a_500_naming_the_request_id_and_the_next_request_works(
        plant: Any, request_args: tuple[str, str, Any], shape: str,
        caplog: pytest.LogCaptureFixture) -> None:
    instance = Instance(ServerConfig(grpc_port=-1))
    backend = FakeLlmBackend()
    add_ready(instance.repository, backend)
    instance.booted = True
    method, path, body = request_args
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(instance)),
                                 base_url="http://t") as client:
        healthy = await client.request(method, path, json=body)
        assert healthy.status_code == 200, healthy.text
        plant(instance, backend)
        with caplog.at_level(logging.ERROR, logger="podium.errors"):
            r = await client.request(method, path, json=body,
                                     headers={"x-request-id": "trace-9"})
        assert r.status_code == 500 and r.headers["x-request-id"] == "trace-9"
        error = r.json()["error"]
        message = error["message"] if shape == "openai" else error
        assert "trace-9" in message and "hunter2" not in r.text
        if shape == "openai":
            assert (error["type"], error["code"]) == ("internal_error", 500)
        [record] = [r for r in caplog.records if r.name == "podium.errors"]
        assert "trace-9" in record.getMessage() and "hunter2" in str(record.exc_info[1])
        assert (await client.get("/health")).status_code == 200  # still serving
