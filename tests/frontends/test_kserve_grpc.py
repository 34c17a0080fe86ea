"""KServe v2 over gRPC, driven by the real tritonclient.grpc (sync, asyncio, streaming)."""

from __future__ import annotations

import asyncio
import json
import queue
from functools import partial

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpcclient
from tritonclient.utils import InferenceServerException

from podium.examples.builders import synthetic_features
from tests.support.kserve_instance import CLASSIC, LLM, Instance, reference_xgb


@pytest.fixture
def client(kserve_instance: Instance) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(kserve_instance.grpc_url)


def test_health_and_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.get_server_metadata(as_json=True)["name"] == "podium"
    for name in [*CLASSIC, LLM]:
        assert client.is_model_ready(name), name
    assert not client.is_model_ready("no-such-model")
    metadata = client.get_model_metadata("xgb-example", as_json=True)
    assert metadata["inputs"] == [{"name": "features", "datatype": "FP32",
                                   "shape": ["-1", "20"]}]
    config = client.get_model_config("python-example", as_json=True)["config"]
    assert config["max_batch_size"] == 64
    assert [o["name"] for o in config["output"]] == ["probability", "label"]
    assert config["output"][1]["data_type"] == "TYPE_STRING"


def test_infer_xgboost_raw(client, examples_dir) -> None:
    features = synthetic_features(4, seed=21)
    tensor = grpcclient.InferInput("features", [4, 20], "FP32")
    tensor.set_data_from_numpy(features)
    result = client.infer("xgb-example", [tensor], model_version="1", request_id="r-1")
    assert result.get_response().id == "r-1"
    np.testing.assert_allclose(result.as_numpy("probability"),
                               reference_xgb(examples_dir, features), rtol=1e-6)


def test_python_ensemble_and_bytes_output(client, examples_dir) -> None:
    features = synthetic_features(3, seed=4)
    tensor = grpcclient.InferInput("features", [3, 20], "FP32")
    tensor.set_data_from_numpy(features)
    result = client.infer("python-example", [tensor])
    expected = reference_xgb(examples_dir, features)
    np.testing.assert_allclose(result.as_numpy("probability"), expected, rtol=1e-6)
    assert [v for v in result.as_numpy("label").reshape(-1)] == \
        [b"positive" if p >= 0.5 else b"negative" for p in expected[:, 0]]


def test_statistics_and_repository(client: grpcclient.InferenceServerClient) -> None:
    stats = client.get_inference_statistics("xgb-example", as_json=True)["model_stats"][0]
    assert int(stats["inference_stats"]["success"]["count"]) >= 1
    index = client.get_model_repository_index(as_json=True)["models"]
    states = {(m["name"], m["version"]): m["state"] for m in index}
    assert states[("torch-example", "1")] == "READY"
    with pytest.raises(InferenceServerException) as err:  # no dependents to unload
        client.unload_model("torch-example", unload_dependents=True)
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "no dependents" in err.value.message()
    assert client.is_model_ready("torch-example")
    client.unload_model("torch-example")  # tritonclient sends unload_dependents=false
    assert not client.is_model_ready("torch-example")
    client.load_model("torch-example")
    assert client.is_model_ready("torch-example")
    with pytest.raises(InferenceServerException) as err:
        client.load_model("nope")
    assert err.value.status() == "StatusCode.NOT_FOUND"
    # tritonclient's config override: only the version policy may change at load
    client.load_model("torch-example", config=json.dumps(
        {"version_policy": {"specific": {"versions": ["1"]}}}))
    assert client.is_model_ready("torch-example", "1")
    with pytest.raises(InferenceServerException) as err:
        client.load_model("torch-example", config=json.dumps({"max_batch_size": 4}))
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "max_batch_size" in err.value.message()
    assert client.is_model_ready("torch-example")


def _llm_inputs(prompt: str, *, stream: bool, params: dict | None = None
                ) -> list[grpcclient.InferInput]:
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
    flag = grpcclient.InferInput("stream", [1], "BOOL")
    flag.set_data_from_numpy(np.array([stream]))
    inputs = [text, flag]
    if params is not None:
        sampling = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
        sampling.set_data_from_numpy(np.array([json.dumps(params).encode()], dtype=object))
        inputs.append(sampling)
    return inputs


def test_decoupled_stream_flags_the_last_response(client) -> None:
    responses: queue.Queue = queue.Queue()

    def callback(result, error) -> None:
        responses.put((result, error))

    client.start_stream(callback=partial(callback))
    client.async_stream_infer(LLM, _llm_inputs("Capital?", stream=True,
                                               params={"max_tokens": "3"}), request_id="s1")
    parts, finals = [], []
    while True:
        result, error = responses.get(timeout=10)
        assert error is None, error
        response = result.get_response()
        parts.append(result.as_numpy("text_output")[0])
        finals.append(response.parameters["triton_final_response"].bool_param)
        assert response.id == "s1"
        if finals[-1]:
            break
    client.stop_stream()
    assert parts == [b"Paris", b" is", b" the"]
    assert finals == [False, False, True]


def test_stream_error_then_good_request(client) -> None:
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer(LLM, _llm_inputs("x", stream=True, params={"max_tokens": "[oops"}))
    result, error = responses.get(timeout=10)
    assert result is None
    assert "max_tokens" in str(error)
    # the stream stays open: the next request on it is served
    client.async_stream_infer(LLM, _llm_inputs("x", stream=False, params={"max_tokens": 1}))
    result, error = responses.get(timeout=10)
    assert error is None
    assert result.as_numpy("text_output").tolist() == [b"xParis"]
    assert result.get_response().parameters["triton_final_response"].bool_param
    client.stop_stream()


def test_asyncio_client_and_stream(kserve_instance: Instance, examples_dir) -> None:
    async def run() -> tuple[np.ndarray, np.ndarray, list[bytes]]:
        client = aiogrpcclient.InferenceServerClient(kserve_instance.grpc_url)
        try:
            assert await client.is_server_ready()
            features = synthetic_features(16, seed=9)
            calls = []
            for row in features:
                tensor = aiogrpcclient.InferInput("features", [1, 20], "FP32")
                tensor.set_data_from_numpy(row[None])
                calls.append(client.infer("xgb-example", [tensor]))
            results = await asyncio.gather(*calls)

            async def requests():
                yield {"model_name": LLM, "inputs": _llm_inputs("Hi", stream=True,
                                                                 params={"max_tokens": 2})}

            texts = []
            async for result, error in client.stream_infer(requests()):
                assert error is None
                texts.append(result.as_numpy("text_output")[0])
                if result.get_response().parameters["triton_final_response"].bool_param:
                    break
            scores = np.concatenate([r.as_numpy("probability") for r in results])
            return features, scores, texts
        finally:
            await client.close()

    features, scores, texts = asyncio.run(run())
    np.testing.assert_allclose(scores, reference_xgb(examples_dir, features), rtol=1e-6)
    assert texts == [b"Paris", b" is"]


def test_scoring_over_grpc(client, kserve_instance: Instance) -> None:
    context = grpcclient.InferInput("context", [1], "BYTES")
    context.set_data_from_numpy(np.array([b"one two three four five"], dtype=object))
    candidates = grpcclient.InferInput("candidates", [3], "BYTES")
    candidates.set_data_from_numpy(np.array([b"six seven", b"eight", b"six nine ten"],
                                            dtype=object))
    result = client.infer(LLM, [context, candidates])
    assert result.as_numpy("num_tokens").tolist() == [2, 1, 3]
    rows = result.as_numpy("token_logprobs")
    assert rows.shape == (3, 3)
    np.testing.assert_allclose(result.as_numpy("logprob_sum"), rows.sum(axis=1), rtol=1e-5)


def test_stream_to_a_classic_model_answers_once_flagged_final(client, examples_dir) -> None:
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    features = synthetic_features(2, seed=8)
    tensor = grpcclient.InferInput("features", [2, 20], "FP32")
    tensor.set_data_from_numpy(features)
    client.async_stream_infer("xgb-example", [tensor], request_id="c1")
    result, error = responses.get(timeout=10)
    client.stop_stream()
    assert error is None
    assert result.get_response().parameters["triton_final_response"].bool_param
    np.testing.assert_allclose(result.as_numpy("probability"),
                               reference_xgb(examples_dir, features), rtol=1e-6)
    assert responses.empty()
