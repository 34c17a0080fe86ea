"""Per-request log lines and X-Request-Id, through a real ASGI app."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import AsyncIterator

import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from fastapi.testclient import TestClient

from podium.metrics import request_log, server


def make_app(log_format: request_log.LogFormat) -> tuple[TestClient, io.StringIO]:
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions() -> dict:
        request_log.annotate(
            protocol="openai", model="smol", version="2", prompt_tokens=7, completion_tokens=3
        )
        return {"ok": True}

    @app.get("/v2/models/{name}/ready")
    async def ready(name: str) -> dict:
        request_log.annotate(protocol="kserve_http", model=name, version="1")
        return {}

    @app.post("/v1/stream")
    async def stream() -> StreamingResponse:
        request_log.annotate(protocol="openai", model="smol", version="2", prompt_tokens=4)

        async def tokens() -> AsyncIterator[bytes]:
            for i in range(3):
                await asyncio.sleep(0.05)
                request_log.annotate(completion_tokens=i + 1)
                yield b"data: tok\n\n"

        return StreamingResponse(tokens(), media_type="text/event-stream")

    @app.get("/boom")
    async def boom() -> dict:
        raise RuntimeError("backend died")

    stream_out = io.StringIO()
    request_log.install(app, log_format, stream_out)
    return TestClient(app, raise_server_exceptions=False), stream_out


def lines(out: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_one_json_line_per_request_with_the_returned_id() -> None:
    client, out = make_app("json")
    response = client.post("/v1/completions")
    rid = response.headers["x-request-id"]
    assert len(rid) == 32 and int(rid, 16) >= 0
    [line] = lines(out)
    assert line["request_id"] == rid
    assert (line["model"], line["version"], line["protocol"]) == ("smol", "2", "openai")
    assert (line["status"], line["prompt_tokens"], line["completion_tokens"]) == (200, 7, 3)
    assert line["latency_s"] > 0
    assert line["path"] == "/v1/completions" and line["method"] == "POST"
    assert (line["level"], line["logger"]) == ("info", "podium.request")
    assert abs(line["ts"] - time.time()) < 60


def test_client_request_id_is_kept() -> None:
    client, out = make_app("json")
    response = client.post("/v1/completions", headers={"X-Request-Id": "trace-42.a:b"})
    assert response.headers["x-request-id"] == "trace-42.a:b"
    assert lines(out)[0]["request_id"] == "trace-42.a:b"


@pytest.mark.parametrize(
    "bad_id",
    ['x" forged="1', "a" * 129, "with space", "ünïcode"],
    ids=["quote", "too-long", "space", "non-ascii"],
)
def test_unsafe_client_ids_are_replaced(bad_id: str) -> None:
    client, out = make_app("json")
    response = client.post("/v1/completions", headers={"X-Request-Id": bad_id.encode("utf-8")})
    rid = response.headers["x-request-id"]
    assert rid != bad_id and len(rid) == 32
    assert lines(out)[0]["request_id"] == rid


def test_streamed_response_is_logged_after_the_last_chunk() -> None:
    client, out = make_app("json")
    response = client.post("/v1/stream")
    assert response.text.count("data:") == 3
    [line] = lines(out)
    assert line["completion_tokens"] == 3
    assert line["latency_s"] >= 0.15


def test_failed_request_is_logged_as_500() -> None:
    client, out = make_app("json")
    assert client.get("/boom").status_code == 500
    [line] = lines(out)
    assert line["status"] == 500 and line["path"] == "/boom"


def test_http_requests_are_counted_under_their_route_template() -> None:
    labels = dict(
        model="resnet",
        version="1",
        protocol="kserve_http",
        endpoint="/v2/models/{name}/ready",
        code="200",
    )
    before = server.REGISTRY.get_sample_value("podium:requests_total", labels) or 0
    client, _ = make_app("json")
    client.get("/v2/models/resnet/ready")
    assert server.REGISTRY.get_sample_value("podium:requests_total", labels) == before + 1


def test_text_format_is_one_readable_line() -> None:
    client, out = make_app("text")
    rid = client.post("/v1/completions").headers["x-request-id"]
    [line] = out.getvalue().splitlines()
    assert line.startswith(f"{rid} POST /v1/completions 200 ")
    assert line.endswith(" openai smol@2 7+3tok")


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_user_is_logged_escaped_and_only_when_named(log_format: str) -> None:
    ctx = request_log.RequestContext(request_id="r", method="POST", path="/v1/completions",
                                     status=200, prompt_tokens=7, completion_tokens=3)
    ctx.latency_s = 0.1
    plain = request_log.format_line(ctx, log_format)  # type: ignore[arg-type]
    assert "user" not in plain
    ctx.user = 'alice"\nforged 200'
    line = request_log.format_line(ctx, log_format)  # type: ignore[arg-type]
    assert "\n" not in line  # one line, whatever the client sent
    if log_format == "json":
        assert json.loads(line)["user"] == ctx.user
    else:
        assert line == plain + ' user="alice\\"\\nforged 200"'


def test_annotate_rejects_unknown_fields_and_protocols() -> None:
    ctx = request_log.RequestContext(request_id="r")
    token = request_log._current.set(ctx)
    try:
        with pytest.raises(TypeError, match="'modle'"):
            request_log.annotate(modle="x")
        with pytest.raises(ValueError, match="'grpc'"):
            request_log.annotate(protocol="grpc")
        request_log.annotate(model="m")
        assert ctx.model == "m"
    finally:
        request_log._current.reset(token)
