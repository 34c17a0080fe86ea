"""Standalone vs embedded per package, and the boot log, on an in-process instance.

The package's `frontends` decides what the instance mounts: a standalone instance answers /v1
with a 404 naming its mode and serves KServe; an embedded one mounts the OpenAI router once
boot has read its packages (503 on /v1 until then). Boot runs here in-process on a Python
model, so every step's log line and duration is checked without starting a process; the real
engine's side (nothing of the OpenAI layer imported) is tests/server/test_standalone_real.py.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import httpx
import pytest

from podium.errors import PackageError
from podium.package.manifest import parse_manifest
from podium.server.app import build_app
from podium.server.boot import boot
from podium.server.config import ServerConfig
from podium.server.frontends import mode_of
from podium.server.instance import Instance
from tests.support.fake_backends import FakeLlmBackend, add_ready

MODEL = '''
class Model:
    def initialize(self, config):
        pass

    def execute(self, requests):
        return [{"y": r["x"] * 2} for r in requests]

    def finalize(self):
        pass
'''
INFER = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.5]}]}
CHAT = {"model": "double", "messages": [{"role": "user", "content": "hi"}]}


def _package(root: Path, frontends: str | None) -> Path:
    root.mkdir()
    (root / "model.py").write_text(MODEL)
    manifest = {"name": "double", "version": "1", "backend": "python", "module": "model.py",
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}]}
    if frontends is not None:
        manifest["frontends"] = frontends
    (root / "podium.json").write_text(json.dumps(manifest))
    return root


def _served(tmp_path: Path, frontends: str | None) -> tuple[Instance, httpx.AsyncClient]:
    """An instance app as `podium serve` builds it: /v1 undecided until boot."""
    instance = Instance(ServerConfig(packages=[_package(tmp_path / "double", frontends)],
                                     grpc_port=-1))
    instance.frontends = None
    app = build_app(instance)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
    return instance, client


@pytest.mark.parametrize("value", [
    pytest.param("openai", id="unknown-mode"),
    pytest.param("Standalone", id="wrong-case"),
    pytest.param(["standalone"], id="a-list"),
    pytest.param(None, id="null"),
])
def test_a_frontends_value_that_is_not_a_mode_names_the_field(value: object) -> None:
    manifest = {"name": "double", "backend": "python", "frontends": value}
    with pytest.raises(PackageError) as caught:
        parse_manifest(manifest)
    assert caught.value.param == "frontends"
    assert "frontends: Input should be 'embedded' or 'standalone'" in caught.value.message
    assert parse_manifest({**manifest, "frontends": "standalone"}).frontends == "standalone"
    assert parse_manifest({"name": "double", "backend": "python"}).frontends == "embedded"


@pytest.mark.parametrize(("modes", "mode"), [
    pytest.param([], "embedded", id="no-packages"),
    pytest.param(["standalone"], "standalone", id="one-standalone"),
    pytest.param(["standalone", "standalone"], "standalone", id="all-standalone"),
    pytest.param(["standalone", "embedded"], "embedded", id="mixed-needs-openai"),
])
def test_the_instance_runs_standalone_only_when_every_package_is(modes: list[str],
                                                                 mode: str) -> None:
    assert mode_of(modes) == mode


async def test_a_standalone_instance_refuses_v1_naming_its_mode_and_serves_kserve(
        tmp_path: Path) -> None:
    instance, client = _served(tmp_path, "standalone")
    async with client:
        await boot(instance)
        assert instance.frontends == "standalone" and instance.is_ready()
        for method, path, body in [("POST", "/v1/chat/completions", CHAT),
                                   ("POST", "/v1/completions", CHAT),
                                   ("GET", "/v1/models", None), ("GET", "/v1", None)]:
            r = await client.request(method, path, json=body)
            assert r.status_code == 404, (path, r.text)
            message = r.json()["error"]["message"]
            assert "runs standalone" in message and '"frontends": "standalone"' in message
            assert "/v2/models/double/generate" in message and path in message
        r = await client.post("/v2/models/double/infer", json=INFER)  # the same server serves
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [3.0]
        ready = (await client.get("/health/ready")).json()
        assert (ready["status"], ready["frontends"]) == ("ready", "standalone")
        await instance.repository.unload_all(timeout_s=5)


async def test_v1_answers_503_until_boot_mounts_the_embedded_openai_api(
        tmp_path: Path) -> None:
    instance, client = _served(tmp_path, None)  # no `frontends`: embedded, today's default
    async with client:
        assert (await client.get("/health/live")).status_code == 200
        r = await client.get("/v1/models")
        assert r.status_code == 503 and "starting" in r.json()["error"]["message"]
        r = await client.post("/v2/models/double/infer", json=INFER)
        assert r.status_code in (404, 503)  # not loaded yet: no inference before ready
        await boot(instance)
        assert instance.frontends == "embedded"
        r = await client.get("/v1/models")
        assert r.status_code == 200 and r.json()["data"] == []  # the OpenAI router's answer
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 400 and "not an LLM" in r.json()["error"]["message"]
        await instance.repository.unload_all(timeout_s=5)


async def test_a_standalone_llm_on_an_embedded_instance_is_refused_on_v1_by_name() -> None:
    instance = Instance(ServerConfig(grpc_port=-1))
    embedded, standalone = FakeLlmBackend("chat"), FakeLlmBackend("kserve-only")
    standalone.manifest = parse_manifest({**standalone.manifest.model_dump(),
                                          "frontends": "standalone"})
    standalone.state = None  # what VllmBackend.load builds for a standalone package
    add_ready(instance.repository, embedded)
    add_ready(instance.repository, standalone)
    instance.booted = True
    app = build_app(instance)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as client:
        body = {"messages": [{"role": "user", "content": "hello"}]}
        r = await client.post("/v1/chat/completions", json={**body, "model": "kserve-only"})
        assert r.status_code == 400
        assert "packaged standalone" in r.json()["error"]["message"]
        assert "/v2/models/kserve-only/generate" in r.json()["error"]["message"]
        r = await client.post("/v1/chat/completions", json={**body, "model": "chat"})
        assert r.status_code == 200, r.text
        models = (await client.get("/v1/models")).json()["data"]
        assert [m["id"] for m in models] == ["chat"]


async def test_the_boot_log_names_each_step_in_order_with_its_duration_ending_at_the_port(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    own, stale = metrics / f"counter_{os.getpid()}.db", metrics / "counter_999999999.db"
    own.touch()
    stale.touch()  # another process's numbers: must not be summed into this run's
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(metrics))
    instance = Instance(ServerConfig(packages=[_package(tmp_path / "double", "standalone")]))
    opened: list[bool] = []

    async def open_grpc_port() -> None:
        opened.append(instance.repository.all_ready())

    instance.open_ports = open_grpc_port
    with caplog.at_level(logging.INFO, logger="podium.boot"):
        await boot(instance)
    order = ["open packages", "mount frontends", "resolve weights", "load plugins",
             "wipe metrics directory", "load double@1", "open gRPC port"]
    assert [s.name for s in instance.boot_steps] == order
    assert opened == [True]  # the port opened only once the model was loaded
    assert (own.exists(), stale.exists()) == (True, False)
    lines = [r.getMessage() for r in caplog.records]
    took = [line for line in lines if line.startswith("boot step") and " took " in line]
    assert [line.split(" took ")[0].removeprefix("boot step ") for line in took] == order
    assert "standalone: KServe v2 over HTTP and gRPC; no OpenAI layer" in took[1]
    assert "(1 stale file(s))" in took[4]
    ready = lines[-1]
    assert ready.startswith("ready: 1 model(s) in ") and "double@1" in ready
    assert " → ".join(order[:2]) not in ready  # each step carries its duration
    assert ready.endswith("s)") and ready.rsplit(" → ", 1)[1].startswith("open gRPC port ")
    for step in instance.boot_steps:
        assert f"{step.name} {step.seconds:.2f}s" in ready
    await instance.repository.unload_all(timeout_s=5)


@pytest.mark.parametrize(("engine_args", "error", "embedded_takes_it"), [
    pytest.param({"chat_template": "{{ x }}"}, "is an argument of vLLM's OpenAI frontend",
                 True, id="openai-frontend-arg"),
    pytest.param({"enable_auto_tool_choice": True}, "is an argument of vLLM's OpenAI frontend",
                 True, id="tool-choice"),
    pytest.param({"no_such_arg": 1}, "is not a vLLM 0.32.0 engine argument", False,
                 id="unknown"),
])
def test_a_standalone_packages_engine_args_are_the_engines_alone(
        engine_args: dict, error: str, embedded_takes_it: bool) -> None:
    from podium.backends.vllm import build_engine_args
    from podium.package.defaults import default_llm_manifest

    standalone = {**default_llm_manifest(), "frontends": "standalone"}
    with pytest.raises(PackageError) as caught:
        build_engine_args(parse_manifest({**standalone, "engine_args": engine_args}), "/w")
    assert error in caught.value.message
    assert caught.value.param == f"engine_args.{next(iter(engine_args))}"
    args = build_engine_args(parse_manifest(standalone), "/w")  # the good one still builds
    # (the engine mode is resolved at boot by package.engine_mode, not in the args)
    assert (args.max_model_len, args.max_num_queued_reqs) == (8192, 256)
    assert not hasattr(args, "chat_template")  # no OpenAI frontend argument at all
    if embedded_takes_it:
        embedded = {**standalone, "frontends": "embedded", "engine_args": engine_args}
        assert hasattr(build_engine_args(parse_manifest(embedded), "/w"), "chat_template")
