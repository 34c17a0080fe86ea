"""Repository operations as Triton does them, on a real `podium serve --repository` driven
with tritonclient HTTP and gRPC: explicit model control (`--load-model`), load/unload, load
with a `config` override, per-version ready/config/statistics, Triton's wording for an
unknown model, `nv_inference_*` metrics on `--metrics-port`; a repository as a user has it
(models failing at load, a library from the server's environment); `none` mode refusing the
load API. Every refusal names its field and is followed by a good request."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from podium.errors import InvalidArgument
from podium.server.config import ServerConfig
from tests.support.harness import RunningInstance, running_instance, start_instance
from tests.support.polling import eventually
from tests.support.ports import free_port
from tests.support.triton_layouts import (
    ADD_SUB,
    ADD_SUB_CONFIG,
    SCALE,
    SCALE_CONFIG,
    write_model,
    write_repository,
)

USES_LIB = '''
import numpy as np
import triton_python_backend_utils as pb_utils
from scipy.special import expit  # a library of the server's environment


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "SCALED", expit(pb_utils.get_input_tensor_by_name(r, "RAW").as_numpy()))])
            for r in requests]
'''
MISSING_LIB = "import no_such_library_podium\n" + SCALE
RAISES = SCALE.replace("class TritonPythonModel:", '''class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("the weights file is corrupt")
''')
LOADED = ["add_sub", "uses_lib", "missing_lib", "raises", "onnx_add", "bad_field"]


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, metrics_port: int
           ) -> Iterator[RunningInstance]:
    root = write_repository(tmp_path_factory.mktemp("triton-ops"))
    write_model(root, "uses_lib", SCALE_CONFIG, USES_LIB)
    write_model(root, "missing_lib", SCALE_CONFIG, MISSING_LIB)
    write_model(root, "raises", SCALE_CONFIG, RAISES)
    log = tmp_path_factory.mktemp("triton-ops-log") / "serve.log"
    loads = [arg for name in LOADED for arg in ("--load-model", name)]
    with running_instance(["--repository", str(root), "--model-control-mode", "explicit",
                           *loads, "--metrics-port", str(metrics_port)], log) as instance:
        yield instance


@pytest.fixture(scope="module")
def http(server: RunningInstance) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url.removeprefix("http://"))


@pytest.fixture(scope="module")
def grpc(server: RunningInstance) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(server.grpc_url)


def _raw(module, raw: np.ndarray):
    tensor = module.InferInput("RAW", list(raw.shape), "FP32")
    tensor.set_data_from_numpy(raw)
    return [tensor]


def _add_sub(module):
    tensors = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, [4], "FP32")
        tensor.set_data_from_numpy(np.ones(4, dtype=np.float32))
        tensors.append(tensor)
    return tensors


def _index(http) -> dict[str, dict]:
    return {(row["name"], row.get("version", "")): row
            for row in http.get_model_repository_index()}


def test_failed_models_are_in_the_index_with_their_reason_and_the_others_serve(http, grpc):
    rows = _index(http)
    assert rows[("add_sub", "1")]["state"] == "READY"
    assert rows[("missing_lib", "1")]["state"] == "UNAVAILABLE"
    assert "no_such_library_podium" in rows[("missing_lib", "1")]["reason"]
    assert "the weights file is corrupt" in rows[("raises", "1")]["reason"]
    assert "field 'optimization'" in rows[("bad_field", "")]["reason"]
    # explicit mode: a model not named by --load-model is known, not loaded
    assert rows[("scale", "1")]["state"] == "UNAVAILABLE"
    assert rows[("scale", "1")]["reason"] == "unloaded"
    grpc_rows = {(m.name, m.version): m for m in grpc.get_model_repository_index().models}
    assert "no_such_library_podium" in grpc_rows[("missing_lib", "1")].reason
    raw = np.array([[0.0, 1.0, -1.0]], dtype=np.float32)
    for module, client in ((httpclient, http), (grpcclient, grpc)):
        result = client.infer("uses_lib", _raw(module, raw))
        np.testing.assert_allclose(result.as_numpy("SCALED"), 1 / (1 + np.exp(-raw)),
                                   rtol=1e-6)


@pytest.mark.parametrize("client", ["http", "grpc"])
def test_an_unknown_model_is_answered_in_tritons_words(client, request):
    triton = request.getfixturevalue(client)
    module = httpclient if client == "http" else grpcclient
    with pytest.raises(InferenceServerException,
                       match="Request for unknown model: 'nope' is not found"):
        triton.get_model_metadata("nope")
    with pytest.raises(InferenceServerException,
                       match="Request for unknown model: 'add_sub' version 7 is not found"):
        triton.infer("add_sub", _add_sub(module), model_version="7")
    assert triton.infer("add_sub", _add_sub(module)).as_numpy("OUTPUT0").tolist() == [2.0] * 4


@pytest.mark.parametrize("client", ["http", "grpc"])
def test_load_and_unload_in_explicit_mode(client, request, http):
    triton = request.getfixturevalue(client)
    module = httpclient if client == "http" else grpcclient
    assert not triton.is_model_ready("scale")
    triton.load_model("scale")
    assert triton.is_model_ready("scale") and triton.is_model_ready("scale", "1")
    raw = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    np.testing.assert_allclose(triton.infer("scale", _raw(module, raw)).as_numpy("SCALED"),
                               raw * 2)
    triton.unload_model("scale")
    assert not triton.is_model_ready("scale")
    assert _index(http)[("scale", "1")]["state"] == "UNAVAILABLE"


@pytest.mark.parametrize("client", ["http", "grpc"])
def test_load_with_a_config_override_then_back_to_the_file(client, request, http):
    triton = request.getfixturevalue(client)
    config = http.get_model_config("onnx_add")
    assert "dynamic_batching" in config
    assert triton.is_model_ready("onnx_add", "1") and triton.is_model_ready("onnx_add", "2")
    override = {k: v for k, v in config.items() if k != "dynamic_batching"}
    override["version_policy"] = {"specific": {"versions": [1]}}
    triton.load_model("onnx_add", config=json.dumps(override))
    assert triton.is_model_ready("onnx_add", "1") and not triton.is_model_ready("onnx_add", "2")
    served = http.get_model_config("onnx_add", "1")
    assert "dynamic_batching" not in served
    assert served["version_policy"] == {"specific": {"versions": ["1"]}}
    stats = http.get_inference_statistics("onnx_add", "1")["model_stats"]
    assert [row["version"] for row in stats] == ["1"]
    metadata = http.get_model_metadata("onnx_add", "1")
    assert metadata["versions"] == ["1"] and metadata["platform"] == "onnxruntime_onnx"
    with pytest.raises(InferenceServerException, match="'onnx_add' version 2 is not found"):
        triton.get_model_metadata("onnx_add", "2")
    triton.load_model("onnx_add")  # no config: config.pbtxt again
    assert triton.is_model_ready("onnx_add", "2")
    assert "dynamic_batching" in http.get_model_config("onnx_add", "2")


SCALE_JSON = {"backend": "python", "max_batch_size": 8,
              "input": [{"name": "RAW", "data_type": "TYPE_FP32", "dims": [3]}],
              "output": [{"name": "SCALED", "data_type": "TYPE_FP32", "dims": [3]}]}


@pytest.mark.parametrize("client", ["http", "grpc"])
def test_load_with_files_then_back_to_the_repository(client, request):
    triton = request.getfixturevalue(client)
    module = httpclient if client == "http" else grpcclient
    raw = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    triple = SCALE.replace("as_numpy() * 2", "as_numpy() * 3").encode()
    triton.load_model("scale", config=json.dumps(SCALE_JSON),
                      files={"file:1/model.py": triple})
    np.testing.assert_allclose(triton.infer("scale", _raw(module, raw)).as_numpy("SCALED"),
                               raw * 3)
    triton.load_model("scale")  # the repository's folder again
    np.testing.assert_allclose(triton.infer("scale", _raw(module, raw)).as_numpy("SCALED"),
                               raw * 2)
    triton.unload_model("scale")


BAD_LOADS = [
    pytest.param("onnx_add", {"config": json.dumps({"backend": "onnxruntime", "optimization":
                                                    {"priority": "PRIORITY_MAX"}})},
                 "field 'optimization' is not supported", id="unsupported-field"),
    pytest.param("onnx_add", {"config": json.dumps({"name": "other", "backend": "python"})},
                 "load parameter 'config' has name='other'", id="wrong-name"),
    pytest.param("onnx_add", {"config": json.dumps({"backend": "onnxruntime",
                                                    "max_batch_size": "lots"})},
                 "not a Triton model config", id="bad-value"),
    pytest.param("scale", {"files": {"file:1/model.py": b"print(1)"}},
                 "load parameter 'file:1/model.py': files replace the model's folder",
                 id="files-without-config"),
    pytest.param("scale", {"config": json.dumps({"backend": "python"}),
                           "files": {"file:../escape.py": b"print(1)"}},
                 "load parameter 'file:../escape.py': a file path inside the model folder",
                 id="file-outside-the-folder"),
    pytest.param("nope", {}, "Request for unknown model: 'nope' is not found", id="unknown"),
]


@pytest.mark.parametrize("client", ["http", "grpc"])
@pytest.mark.parametrize(("model", "kwargs", "words"), BAD_LOADS)
def test_a_bad_load_is_refused_naming_it_then_a_good_one_works(client, request, model,
                                                                 kwargs, words):
    triton = request.getfixturevalue(client)
    with pytest.raises(InferenceServerException, match=re.escape(words)) as raised:
        triton.load_model(model, **kwargs)
    status = str(raised.value.status())
    assert status in ("400", "404", "StatusCode.INVALID_ARGUMENT", "StatusCode.NOT_FOUND")
    assert triton.is_model_ready("onnx_add", "2")  # unchanged
    triton.load_model("onnx_add")
    assert triton.is_model_ready("onnx_add", "2")


def test_triton_metrics_on_the_metrics_port(server, http, metrics_port):
    for _ in range(3):
        http.infer("add_sub", _add_sub(httpclient))
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    found = {m.group(1): int(m.group(2)) for m in re.finditer(
        r'^(nv_inference_\w+)\{model="add_sub",version="1"\} (\d+)$', text, re.M)}
    assert found["nv_inference_request_success"] >= 3
    assert found["nv_inference_count"] >= 3 and found["nv_inference_exec_count"] >= 1
    assert found["nv_inference_request_duration_us"] > 0
    assert "nv_inference_request_failure" in found
    assert "podium:" in text  # Podium's own metrics are there too


def test_flags_that_cannot_be_honoured_are_refused_naming_them(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="poll follows a repository folder") as raised:
        ServerConfig(model_control_mode="poll")
    assert raised.value.param == "--model-control-mode"
    with pytest.raises(InvalidArgument, match="needs --model-control-mode=explicit") as raised:
        ServerConfig(load_models=["add_sub"])
    assert raised.value.param == "--load-model"
    with pytest.raises(InvalidArgument, match="needs --model-control-mode=poll") as raised:
        ServerConfig(repository=tmp_path, repository_poll_secs=2.0)
    assert raised.value.param == "--repository-poll-secs"
    good = ServerConfig(model_control_mode="explicit", load_models=["*"])
    assert good.model_control().loads_at_start("anything")
    polling = ServerConfig(model_control_mode="poll", repository=tmp_path)
    assert polling.model_control().poll_interval_s == 15.0  # Triton's default


def test_none_mode_refuses_the_load_api_in_tritons_words(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    write_model(root, "add_sub", ADD_SUB_CONFIG, ADD_SUB)
    with running_instance(["--repository", str(root), "--model-control-mode", "none"],
                          tmp_path / "serve.log") as server:
        http = httpclient.InferenceServerClient(server.http_url.removeprefix("http://"))
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        for triton, module in ((http, httpclient), (grpc, grpcclient)):
            for action in (triton.load_model, triton.unload_model):
                with pytest.raises(InferenceServerException,
                                   match="explicit model load / unload is not allowed"):
                    action("add_sub")
            assert triton.infer("add_sub", _add_sub(module)).as_numpy("OUTPUT0")[0] == 2.0


def test_a_load_model_that_names_no_model_stops_the_boot(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    write_model(root, "add_sub", ADD_SUB_CONFIG, ADD_SUB)
    instance = start_instance(["--repository", str(root), "--model-control-mode", "explicit",
                               "--load-model", "add_sbu"], tmp_path / "serve.log")
    try:
        assert instance.process.wait(60) != 0
    finally:
        instance.stop()
    assert "--load-model add_sbu: no such model in the repository" in instance.log()


def _wait(condition, what: str) -> None:
    assert eventually(_quietly(condition), timeout_s=60), what


def _quietly(condition):
    def check() -> bool:
        try:
            return bool(condition())
        except InferenceServerException:
            return False
    return check


def test_poll_mode_follows_the_repository_folder(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    write_model(root, "add_sub", ADD_SUB_CONFIG, ADD_SUB)
    with running_instance(["--repository", str(root), "--model-control-mode", "poll",
                           "--repository-poll-secs", "0.2"], tmp_path / "serve.log") as server:
        http = httpclient.InferenceServerClient(server.http_url.removeprefix("http://"))
        with pytest.raises(InferenceServerException,
                           match="explicit model load / unload is not allowed"):
            http.load_model("add_sub")
        assert http.infer("add_sub", _add_sub(httpclient)).as_numpy("OUTPUT0")[0] == 2.0

        write_model(root, "scale", SCALE_CONFIG, SCALE)  # a new model folder
        _wait(lambda: http.is_model_ready("scale", "1"), "the new model loads")
        (root / "scale" / "2").mkdir()  # a new version: the newest is served
        (root / "scale" / "2" / "model.py").write_text(SCALE)
        _wait(lambda: http.is_model_ready("scale", "2") and not http.is_model_ready("scale", "1"),
              "version 2 replaces version 1")
        changed = ADD_SUB.replace("(a + b)", "(a + b + 1)")  # a changed file: reloaded
        (root / "add_sub" / "1" / "model.py").write_text(changed)
        _wait(lambda: http.infer("add_sub", _add_sub(httpclient)).as_numpy("OUTPUT0")[0] == 3.0,
              "the changed model.py serves")
        write_model(root, "broken", SCALE_CONFIG + "optimization { }\n", SCALE)
        _wait(lambda: "optimization" in _index(http).get(("broken", ""), {}).get("reason", ""),
              "a broken new model is in the index with its reason")
        shutil.rmtree(root / "scale")  # a model folder gone: unloaded and forgotten
        _wait(lambda: not any(name == "scale" for name, _ in _index(http)),
              "the removed model leaves the index")
        assert http.infer("add_sub", _add_sub(httpclient)).as_numpy("OUTPUT0")[0] == 3.0
