"""The gateway admits to the bound a classic model's instance measured for itself: learned from
the instance's `podium-admission-bound` answer header (a real `podium serve` of xgb-example),
never sent on to the client, the smaller of it and the gateway's own bound, and a burst past
it shed from the request's head with `Retry-After`."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from podium.examples.builders import synthetic_features, write_xgb_example
from podium.gateway.admission import Admission
from podium.gateway.early_shed import EarlyShed
from podium.gateway.http_server import bounded_head_protocol
from podium.gateway.limits import GatewayLimits
from podium.gateway.proxy import Gateway
from podium.routes.stats import VersionStats
from podium.routes.table import Endpoint
from tests.support.polling import eventually
from tests.support.ports import free_port
from tests.support.servers import Served

MODEL = "xgb-example"
INFER = f"/v2/models/{MODEL}/infer"
BODY = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 20],
                    "data": synthetic_features(1, seed=5)[0].tolist()}]}
HEADER = "podium-admission-bound"
GATEWAY_BOUND = 100_000


def test_the_smaller_of_the_measured_and_the_gateways_bound_holds() -> None:
    admission = Admission(VersionStats(), max_in_flight=256)
    endpoint = Endpoint("i", "http://127.0.0.1:1")
    assert admission.bound(endpoint) == 256
    admission.learn(endpoint, "24")
    assert admission.bound(endpoint) == 24
    admission.learn(endpoint, "1000")  # never past the gateway's own bound
    assert admission.bound(endpoint) == 256
    endpoint.max_in_flight = 40  # the package's queue: smaller still
    assert admission.bound(endpoint) == 40
    for bad in ("0", "-3", "many", "", None):  # changes nothing
        admission.learn(endpoint, bad)
        assert endpoint.measured_bound == 1000
    admission.learn(endpoint, "16")
    assert admission.bound(endpoint) == 16


class Instance:
    """`podium serve` of xgb-example on a free port."""

    def __init__(self, root: Path, *flags: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = root / "serve.log"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "podium.cli", "serve",
             str(write_xgb_example(root / MODEL)), "--host", "127.0.0.1", "--http-port",
             str(self.port), "--grpc-port", "-1", *flags],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT)

        def ready() -> bool:
            assert self.process.poll() is None, self.log.read_text()[-2000:]
            try:
                return httpx.get(f"{self.url}/health/ready").status_code == 200
            except httpx.HTTPError:
                return False
        try:
            assert eventually(ready, timeout_s=60), "not ready"
        except BaseException:  # never left running
            self.stop()
            raise

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Instance]:
    served = Instance(tmp_path_factory.mktemp("measured"), "--classic-target-wait-s", "2")
    try:
        yield served
    finally:
        served.stop()


class Front:
    """A gateway (its own bound far above any measured one, early shed as `podium gateway`)
    with the instance as xgb-example@1."""

    def __init__(self, url: str) -> None:
        self.gateway = Gateway(limits=GatewayLimits(max_in_flight_per_instance=GATEWAY_BOUND))
        self.endpoint = Endpoint("xgb-1", url)
        self.gateway.table.add_endpoint(MODEL, "1", self.endpoint)
        self.gateway.table.set_split(MODEL, {"1": 100})
        self.served = Served(self.gateway.app(), http=bounded_head_protocol(
            1 << 16, shed=EarlyShed(self.gateway)))
        self.client = httpx.Client(base_url=self.served.url, timeout=10)

    def close(self) -> None:
        self.client.close()
        self.served.stop()


@pytest.fixture
def front(instance: Instance) -> Iterator[Front]:
    served = Front(instance.url)
    try:
        yield served
    finally:
        served.close()


def test_the_instance_sends_its_bound_and_logs_it_at_boot(instance: Instance) -> None:
    answer = httpx.post(f"{instance.url}{INFER}", json=BODY)
    assert answer.status_code == 200
    config = httpx.get(f"{instance.url}/v2/models/{MODEL}/config").json()["admission"]
    assert config["target_wait_s"] == 2 and config["target_wait_source"] == "flag"
    assert int(answer.headers[HEADER]) >= config["floor"] == 16
    assert "admission of xgb-example@1: in-flight bound 16 for a 2s target wait (flag)" \
        in instance.log.read_text()


def test_the_gateway_learns_the_bound_and_strips_the_header(front: Front) -> None:
    answer = front.client.post(INFER, json=BODY)
    assert answer.status_code == 200 and HEADER not in answer.headers
    assert answer.json()["model_name"] == MODEL
    assert front.endpoint.measured_bound is not None
    assert front.gateway.admission.bound(front.endpoint) == front.endpoint.measured_bound


def test_a_measured_bound_grows_with_the_instances_measured_speed(front: Front,
                                                                  instance: Instance) -> None:
    for _ in range(80):  # past the requests measured before the rate is trusted
        assert front.client.post(INFER, json=BODY).status_code == 200
    config = httpx.get(f"{instance.url}/v2/models/{MODEL}/config").json()["admission"]
    assert config["completions_per_busy_s"] is not None
    # 2 s of any machine's xgb-example is more than the floor
    assert front.endpoint.measured_bound is not None and front.endpoint.measured_bound > 16


def test_a_burst_past_the_measured_bound_is_shed_with_retry_after(front: Front) -> None:
    assert front.client.post(INFER, json=BODY).status_code == 200  # learned
    measured = front.endpoint.measured_bound
    assert measured is not None and front.gateway.admission.bound(front.endpoint) == measured
    front.endpoint.in_flight_elsewhere = measured  # a burst from other gateways holds it
    refused = front.client.post(INFER, json=BODY)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert f"has {measured} requests in flight (the instance's measured bound" \
        in refused.json()["error"]
    again = front.client.post(INFER, json=BODY)  # the cached refusal, the same bytes
    assert (again.status_code, again.content) == (429, refused.content)
    front.endpoint.in_flight_elsewhere = 0
    assert front.client.post(INFER, json=BODY).status_code == 200


def test_a_bad_target_wait_stops_the_instance_naming_the_flag_then_a_good_one_serves(
        tmp_path: Path) -> None:
    bad = subprocess.run([sys.executable, "-m", "podium.cli", "serve",
                          str(write_xgb_example(tmp_path / MODEL)),
                          "--classic-target-wait-s", "0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--classic-target-wait-s" in bad.stderr
    good = Instance(tmp_path / "good", "--classic-target-wait-s", "0.05")
    try:
        answer = httpx.post(f"{good.url}{INFER}", json=BODY)
        assert answer.status_code == 200 and answer.headers[HEADER] == "16"
    finally:
        good.stop()
