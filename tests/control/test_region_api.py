"""Regions through the REST API and the CLI: deploy to chosen regions, progress per region in
`status` and `rollouts`, bad region input refused with the field named."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from podium.control.api import create_app
from podium.control.plane import ControlPlane
from podium.control.region_config import RegionSpec, load_file, parse_flag
from podium.control.store import Store
from podium.errors import InvalidArgument
from tests.support.control_api import package_dir
from tests.support.control_cli import podium
from tests.support.fake_regions import FakeRegions
from tests.support.servers import Served

FAST = {"stages": [50, 100], "num_instances": 1, "ready_timeout_ms": 5_000,
        "analysis_window_ms": 1_000, "warm_delay_ms": 500, "min_requests": 5, "bake_ms": 2_000}


@dataclass
class RegionEnv:
    regions: FakeRegions
    store: Store
    plane: ControlPlane
    client: TestClient

    def run_until_done(self, limit_ms: int = 120_000) -> None:
        while self.store.list_rollouts(status="running") and self.regions.now_ms < limit_ms:
            self.plane.tick()
            self.regions.now_ms += 250


@pytest.fixture
def env(tmp_path: Path) -> Iterator[RegionEnv]:
    regions = FakeRegions(names=("eu", "us"))
    store = Store.open(f"sqlite:///{tmp_path / 'c.db'}")
    store.set_regions([RegionSpec("eu", http_port=9000, grpc_port=9001),
                       RegionSpec("us", http_port=9002, grpc_port=9003)])
    plane = ControlPlane(store, regions, clock=lambda: regions.now_ms,
                         materialize=lambda _p: None)
    e = RegionEnv(regions, store, plane, TestClient(create_app(plane)))
    for version in ("1", "2"):
        r = e.client.post("/v1/packages", json={"path": package_dir(tmp_path, "iris", version)})
        assert r.status_code == 201, r.text
    yield e
    store.close()


def test_deploy_to_every_region_then_one_shows_progress_per_region(env: RegionEnv) -> None:
    assert env.client.get("/v1/regions").json()[1] == {
        "name": "us", "position": 1, "runtime": "local", "ray_address": None,
        "http_port": 9002, "grpc_port": 9003}
    r = env.client.post("/v1/rollouts", json={"model": "iris", "version": "1", **FAST})
    assert r.status_code == 201, r.text
    rows = r.json()["regions"]
    assert [(g["region"], g["status"]) for g in rows] == [("eu", "running"), ("us", "pending")]
    env.run_until_done()
    status = env.client.get("/v1/status").json()
    assert list(status["models"]["iris"]["regions"]) == ["eu", "us"]
    assert status["models"]["iris"]["regions"]["us"]["aliases"] == {"latest": "1"}

    r = env.client.post("/v1/rollouts", json={"model": "iris", "version": "2", "regions": ["us"],
                                              **FAST})
    assert r.status_code == 201, r.text
    env.run_until_done()
    by_region = env.client.get("/v1/status").json()["models"]["iris"]["regions"]
    assert by_region["us"]["splits"] == {"2": 100} and by_region["eu"]["splits"] == {"1": 100}
    [latest, _first] = env.client.get("/v1/rollouts").json()
    assert [(g["region"], g["status"]) for g in latest["regions"]] == [("us", "succeeded")]
    # scaling one region leaves the other alone
    r = env.client.put("/v1/deployments/iris/1/scaling",
                       json={"min_instances": 1, "max_instances": 3, "region": "eu"})
    assert (r.status_code, r.json()["region"]) == (200, "eu")
    r = env.client.put("/v1/deployments/iris/1/scaling",
                       json={"min_instances": 1, "max_instances": 3, "region": "mars"})
    assert r.status_code == 404 and "in region mars" in r.json()["error"]["message"]


@pytest.mark.parametrize(("extra", "param", "message"), [
    ({"regions": ["eu", "mars"]}, "regions", "region 'mars' is not declared; declared regions: "
                                             "eu, us"),
    ({"regions": ["EU!"]}, "regions", "must be distinct region names"),
    ({"regions": ["eu", "eu"]}, "regions", "must be distinct region names"),
    ({"region_failure": "shrug"}, "region_failure", "region_failure"),
    ({"bake_ms": -1}, "bake_ms", "bake_ms=-1 is out of range"),
], ids=["unknown", "bad-name", "twice", "policy", "bake"])
def test_bad_region_input_is_a_400_naming_it_then_a_good_deploy_works(
        env: RegionEnv, extra: dict, param: str, message: str) -> None:
    r = env.client.post("/v1/rollouts", json={"model": "iris", "version": "1", **FAST, **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert message in error["message"] and error["param"] == param
    assert env.store.list_rollouts() == []
    r = env.client.post("/v1/rollouts", json={"model": "iris", "version": "1", **FAST})
    assert r.status_code == 201, r.text


def test_cli_deploys_by_region_and_prints_each_region(env: RegionEnv,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    served = Served(env.client.app)
    try:
        api = served.url
        assert podium("deploy", "iris@1", "--stages", "100", "--regions", "us,eu", "--bake", "1",
                      "--region-failure", "keep-earlier", "--api", api, "--json") == 0
        config = json.loads(capsys.readouterr().out)["config"]
        assert (config["regions"], config["bake_ms"], config["region_failure"]) == (
            ["us", "eu"], 1000, "keep-earlier")
        assert podium("rollouts", "--api", api) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[1].split()[:2] == ["us:", "running"] and out[2].split()[:3] == [
            "eu:", "pending", "-"]
        env.run_until_done()
        assert podium("status", "--api", api) == 0
        out = capsys.readouterr().out
        assert "iris  [us]  split={'1': 100}" in out and "iris  [eu]" in out
        assert podium("regions", "--api", api) == 0
        assert capsys.readouterr().out.startswith("1. eu  runtime=local  http=9000")
        assert podium("deploy", "iris@2", "--regions", "mars", "--api", api) == 2
        assert "region 'mars' is not declared" in capsys.readouterr().err
    finally:
        served.stop()


def test_region_flags_and_files_are_checked_with_the_field_named(tmp_path: Path) -> None:
    spec = parse_flag("name=eu,http=9000,grpc=-1,runtime=ray,ray-address=10.0.0.1:6379")
    assert (spec.name, spec.http_port, spec.grpc_port, spec.ray_address) == (
        "eu", 9000, -1, "10.0.0.1:6379")
    for text, message in (("http=9000", "has no name"), ("name=eu,port=1", "'port=1' is not"),
                          ("name=eu,http=x", "http_port must be a port number"),
                          ("name=eu,runtime=k8s", "runtime 'k8s' is not one of local, ray"),
                          ("name=eu,ray-address=h:1", "ray_address needs runtime=ray")):
        with pytest.raises(InvalidArgument, match=message):
            parse_flag(text)
    toml = tmp_path / "regions.toml"
    toml.write_text('[[region]]\nname = "eu"\nhttp_port = 9000\ngrpc_port = 9001\n'
                    '[[region]]\nname = "us"\nhttp_port = 9002\ngrpc_port = 9003\n')
    assert [s.name for s in load_file(toml)] == ["eu", "us"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"regions": [{"name": "eu", "zone": "1"}]}))
    with pytest.raises(InvalidArgument, match="'zone' is not a region field"):
        load_file(bad)
    with pytest.raises(InvalidArgument, match="port 9000 is given to two gateways"):
        podium("up", "--region", "name=eu,http=9000,grpc=9001",  # refused before starting
               "--region", "name=us,http=9000,grpc=9003")
    with pytest.raises(InvalidArgument, match="--region or --regions-file, not both"):
        podium("up", "--region", "name=eu,http=9000,grpc=9001", "--regions-file", str(toml))


def test_each_regions_gateways_follow_its_part_of_the_api_on_its_ports(tmp_path: Path) -> None:
    from podium.control.up import UpConfig
    from podium.control.up_region import gateway_command

    spec = RegionSpec("eu", http_port=9100, grpc_port=9101)
    config = UpConfig(home=tmp_path, api_port=8090, regions=(spec,))
    command = gateway_command(config, "eu-gateway-0", region=spec)
    flags = dict(zip(command[4::2], command[5::2], strict=False))
    assert (flags["--control"], flags["--http-port"], flags["--grpc-port"]) == (
        "http://127.0.0.1:8090/regions/eu", "9100", "9101")
    plain = gateway_command(UpConfig(home=tmp_path, api_port=8090), "gateway-0")
    assert "http://127.0.0.1:8090" in plain and "/regions/" not in " ".join(plain)
    with pytest.raises(InvalidArgument, match="port 8090 is given to two gateways"):
        UpConfig(home=tmp_path, api_port=8090,
                 regions=(spec, RegionSpec("us", http_port=8090, grpc_port=-1)))
