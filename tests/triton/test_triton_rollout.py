"""A Triton Python-backend model through the control plane, end to end: announced from its
model folder, v1 deployed, then rolled out Red-Black to v2 while tritonclient calls the real
gateway (real `podium serve` instances of the snapshots), without one failed request."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from podium.control.rollout_config import RolloutConfig
from tests.support.echo_platform import Platform
from tests.support.triton_layouts import write_model

SCALED = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.factor = float(args["model_version"])  # version N multiplies by N

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * self.factor)])
            for r in requests]
'''

CONFIG = '''
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
dynamic_batching { }
'''

FIRST = RolloutConfig(stages=(100,), num_instances=1, ready_timeout_ms=60_000,
                      analysis_window_ms=0, warm_delay_ms=0)
STAGED = RolloutConfig(stages=(50, 100), num_instances=1, ready_timeout_ms=60_000,
                       analysis_window_ms=1_500, min_requests=5, warm_delay_ms=1_000,
                       max_p99_ratio=10.0, p99_slack_ms=1000.0)  # the error rule is the point


class Trickle:
    """One tritonclient HTTP client calling the gateway back to back until stopped."""

    def __init__(self, url: str) -> None:
        self.url = url.removeprefix("http://")
        self.results: list[tuple[str, str]] = []  # (version or "", error or "")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[tuple[str, str]]:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.results

    def wait(self, count: int, platform: Platform) -> None:
        platform.wait_for(lambda: len(self.results) >= count, timeout_s=120)

    def _run(self) -> None:
        client = httpclient.InferenceServerClient(self.url, network_timeout=30)
        x = np.array([[1.0, 2.0]], dtype=np.float32)
        while not self._stop.is_set():
            tensor = httpclient.InferInput("X", [1, 2], "FP32")
            tensor.set_data_from_numpy(x)
            try:
                result = client.infer("scaled", [tensor])
                version = result.get_response()["model_version"]
                np.testing.assert_allclose(result.as_numpy("Y"), x * float(version))
                self.results.append((version, ""))
            except Exception as exc:  # every failure is counted, none hidden
                self.results.append(("", repr(exc)))
        client.close()


@pytest.fixture
def platform(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Platform]:
    monkeypatch.setenv("PODIUM_HOME", str(tmp_path / "home"))  # snapshots; inherited by the
    p = Platform(tmp_path)                                     # instances
    yield p
    p.close()


def test_red_black_then_versioned_rollouts_of_a_triton_model(
        platform: Platform, tmp_path: Path) -> None:
    repo = tmp_path / "triton-repo"
    write_model(repo, "scaled", CONFIG, SCALED, versions=("1", "2"))
    announced = platform.plane.announce(str(repo / "scaled"))
    assert [row["version"] for row in announced["announced"]] == ["1", "2"]
    assert platform.wait_done(platform.plane.deploy("scaled", "1", FIRST)) == "succeeded"

    trickle = Trickle(platform.url)
    trickle.start()
    trickle.wait(50, platform)
    rollout_id = platform.plane.deploy("scaled", "2", STAGED)
    status = platform.wait_done(rollout_id)
    trickle.wait(len(trickle.results) + 50, platform)
    results = trickle.stop()

    assert status == "succeeded", platform.store.get_rollout(rollout_id).reason
    assert [error for _, error in results if error] == []
    versions = Counter(version for version, _ in results)
    assert versions["1"] > 0 and versions["2"] > 0
    assert {version for version, _ in results[-20:]} == {"2"}
    platform.wait_for(lambda: [i.version for i in platform.runtime.instances()] == ["2"])

    # a new version folder, announced alone, then Versioned: both versions side by side
    (repo / "scaled" / "3").mkdir()
    (repo / "scaled" / "3" / "model.py").write_text(SCALED)
    again = platform.plane.announce(str(repo / "scaled"))
    assert [row["version"] for row in again["announced"]] == ["3"]
    assert again["skipped"] == ["1", "2"]
    versioned = RolloutConfig(strategy="versioned", num_instances=1, ready_timeout_ms=60_000)
    assert platform.wait_done(platform.plane.deploy("scaled", "3", versioned)) == "succeeded"
    platform.wait_for(lambda: platform.gateway.table.models().get("scaled") == ["2", "3"])
    client = httpclient.InferenceServerClient(platform.url.removeprefix("http://"))
    x = np.array([[1.0, 2.0]], dtype=np.float32)
    for version in ("2", "3", "latest"):  # unversioned requests stay on the split (v2)
        tensor = httpclient.InferInput("X", [1, 2], "FP32")
        tensor.set_data_from_numpy(x)
        result = client.infer("scaled", [tensor], model_version=version)
        served = result.get_response()["model_version"]
        assert served == ("3" if version == "latest" else version)
        np.testing.assert_allclose(result.as_numpy("Y"), x * float(served))
    client.close()
