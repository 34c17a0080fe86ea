"""An instance with inference and admin keys and the control plane's credential: each route
takes its role's keys only, over HTTP and gRPC; liveness stays open."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import tritonclient.grpc.aio as aiogrpcclient
from tritonclient.utils import InferenceServerException

from podium.frontends.kserve_grpc import create_server
from podium.server.app import build_app
from podium.server.config import ServerConfig
from podium.server.instance import Instance
from tests.support.fake_backends import FakeLlmBackend, add_ready
from tests.support.ports import free_port

KEYS = {"api_keys": ["infer-a", "infer-b"], "admin_keys": ["admin-a"],
        "internal_key": "internal"}
CHAT = {"model": "fake-llm", "messages": [{"role": "user", "content": "hi"}]}
INFER, ADMIN, INTERNAL = "infer-b", "admin-a", "internal"


def _instance(**config: object) -> Instance:
    instance = Instance(ServerConfig(grpc_port=-1, **config))
    add_ready(instance.repository, FakeLlmBackend())
    instance.booted = True
    return instance


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=build_app(_instance(**KEYS)))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        yield client


async def _status(client: httpx.AsyncClient, route: tuple[str, str], key: str | None) -> int:
    method, path = route
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = CHAT if path.startswith("/v1/chat") else ({} if method == "POST" else None)
    return (await client.request(method, path, json=body, headers=headers)).status_code


INFERENCE_ROUTES = [("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
                    ("GET", "/v2/models/fake-llm"), ("GET", "/health/ready"),
                    ("GET", "/v2/health/ready")]
ADMIN_ROUTES = [("POST", "/v2/repository/index"), ("GET", "/metrics")]


@pytest.mark.parametrize("route", INFERENCE_ROUTES, ids=lambda r: r[1])
async def test_inference_routes_take_inference_keys_not_admin_keys(
        http: httpx.AsyncClient, route: tuple[str, str]) -> None:
    for key in (None, ADMIN, "nope"):
        assert await _status(http, route, key) == 401, key
    for key in (INFER, "infer-a", INTERNAL):
        assert await _status(http, route, key) == 200, key


@pytest.mark.parametrize("route", ADMIN_ROUTES, ids=lambda r: r[1])
async def test_admin_routes_take_admin_keys_not_inference_keys(
        http: httpx.AsyncClient, route: tuple[str, str]) -> None:
    for key in (None, INFER, "nope"):
        r = await _status(http, route, key)
        assert r == 401, key
    for key in (ADMIN, INTERNAL):
        assert await _status(http, route, key) == 200, key


async def test_a_refused_admin_call_says_which_key_it_needs(http: httpx.AsyncClient) -> None:
    r = await http.post("/v2/repository/models/fake-llm/unload", json={},
                        headers={"Authorization": f"Bearer {INFER}"})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert "admin key" in r.json()["error"] and INFER not in r.text
    # the model was not unloaded: inference still answers
    assert await _status(http, ("POST", "/v1/chat/completions"), INFER) == 200


@pytest.mark.parametrize("path", ["/health", "/health/live", "/v2/health/live"])
async def test_liveness_needs_no_key(http: httpx.AsyncClient, path: str) -> None:
    assert (await http.get(path)).status_code == 200


async def test_one_api_key_alone_still_opens_every_route() -> None:
    """`--api-key K` without an admin key means what it always did: K for everything."""
    transport = httpx.ASGITransport(app=build_app(_instance(api_key="k")))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        for route in [*INFERENCE_ROUTES, *ADMIN_ROUTES]:
            assert await _status(client, route, None) == 401, route
            assert await _status(client, route, "k") == 200, route


async def test_grpc_methods_take_their_roles_keys() -> None:
    instance = _instance(**KEYS)
    port = free_port()
    server = create_server(instance.repository, port=port, host="127.0.0.1",
                           server_ready=lambda: True, access=instance.config.access())
    await server.start()
    client = aiogrpcclient.InferenceServerClient(f"127.0.0.1:{port}")

    def auth(key: str | None) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"} if key else {}

    async def refused(call: object) -> bool:
        try:
            await call  # type: ignore[misc]
        except InferenceServerException as exc:
            assert exc.status() == "StatusCode.UNAUTHENTICATED", exc
            return True
        return False

    try:
        assert await client.is_server_live()  # liveness: no key
        for key in (None, ADMIN):
            assert await refused(client.is_model_ready("fake-llm", headers=auth(key)))
        for key in (None, INFER):
            assert await refused(client.get_model_repository_index(headers=auth(key)))
            assert await refused(client.unload_model("fake-llm", headers=auth(key)))
        for key in (INFER, INTERNAL):
            assert await client.is_model_ready("fake-llm", headers=auth(key))
        for key in (ADMIN, INTERNAL):
            index = await client.get_model_repository_index(headers=auth(key), as_json=True)
            assert [m["name"] for m in index["models"]] == ["fake-llm"]
    finally:
        await client.close()
        await server.stop(grace=1)


async def test_a_running_instance_takes_keys_rotated_in_its_key_file(tmp_path) -> None:
    keys = tmp_path / "inference.keys"
    keys.write_text("old-key\n")
    transport = httpx.ASGITransport(app=build_app(_instance(api_key_files=[keys])))
    route = ("POST", "/v1/chat/completions")
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        assert await _status(client, route, "old-key") == 200
        assert await _status(client, route, "new-key") == 401
        new = tmp_path / "inference.keys.new"
        new.write_text("new-key\n")
        new.replace(keys)  # no restart
        assert await _status(client, route, "old-key") == 401
        assert await _status(client, route, "new-key") == 200


@pytest.mark.parametrize(("argv", "environ", "api_keys", "admin_keys"), [
    (["--api-key", "a", "--api-key", "b", "--admin-key", "c"], {}, ["a", "b"], ["c"]),
    ([], {"PODIUM_API_KEY": "env-a", "PODIUM_ADMIN_KEY": "env-c"}, ["env-a"], ["env-c"]),
    (["--api-key", "flag"], {"PODIUM_API_KEY": "env-a"}, ["flag"], []),
], ids=["repeated-flags", "environment", "a-flag-overrides-the-environment"])
def test_podium_serve_key_flags(monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                environ: dict[str, str], api_keys: list[str],
                                admin_keys: list[str]) -> None:
    from podium.cli import build_parser, key_settings

    for name in ("PODIUM_API_KEY", "PODIUM_ADMIN_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    settings = key_settings(build_parser().parse_args(["serve", *argv]))
    assert (settings["api_keys"], settings["admin_keys"]) == (api_keys, admin_keys)
