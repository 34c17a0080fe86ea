"""KServe v2 over HTTP, driven by the real tritonclient (sync and asyncio) against uvicorn."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient

from podium.examples.builders import synthetic_features
from tests.support.kserve_instance import CLASSIC, LLM, Instance, reference_xgb


@pytest.fixture
def client(kserve_instance: Instance) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(kserve_instance.http_url, concurrency=8)


def infer_xgb(client: httpclient.InferenceServerClient, features: np.ndarray, *,
              binary: bool = True) -> np.ndarray:
    tensor = httpclient.InferInput("features", list(features.shape), "FP32")
    tensor.set_data_from_numpy(features, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput("probability", binary_data=binary)]
    result = client.infer("xgb-example", [tensor], outputs=outputs)
    return result.as_numpy("probability")


def test_server_health_and_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    metadata = client.get_server_metadata()
    assert metadata["name"] == "podium"
    assert "binary_tensor_data" in metadata["extensions"]
    for name in [*CLASSIC, LLM]:
        assert client.is_model_ready(name), name
    assert not client.is_model_ready("no-such-model")


def test_model_metadata_declared_and_derived(client: httpclient.InferenceServerClient) -> None:
    xgb = client.get_model_metadata("xgb-example")
    assert xgb["versions"] == ["1"]
    assert xgb["platform"] == "xgboost"
    assert xgb["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 20]}]
    # onnx-example declares nothing: its I/O comes from the graph
    onnx = client.get_model_metadata("onnx-example", "1")
    assert onnx["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert onnx["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}]
    config = client.get_model_config("torch-example")
    assert config["max_batch_size"] == 32
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_xgboost_scores_match_the_booster(client, examples_dir, binary: bool) -> None:
    features = synthetic_features(5, seed=7)
    scores = infer_xgb(client, features, binary=binary)
    assert scores.shape == (5, 1)
    np.testing.assert_allclose(scores, reference_xgb(examples_dir, features), rtol=1e-6)


def test_torch_and_onnx(client: httpclient.InferenceServerClient) -> None:
    x = np.array([[1, 2, 3, 4], [0, 0, 0, 0]], dtype=np.float32)
    tensor = httpclient.InferInput("x", [2, 4], "FP32")
    tensor.set_data_from_numpy(x)
    probabilities = client.infer("torch-example", [tensor]).as_numpy("probabilities")
    assert probabilities.shape == (2, 3)
    np.testing.assert_allclose(probabilities.sum(axis=1), [1, 1], rtol=1e-5)
    y = client.infer("onnx-example", [tensor]).as_numpy("y")
    weight = np.array([[1, -1], [2, 0], [0, 3], [-1, 1]], dtype=np.float32)
    np.testing.assert_allclose(y, np.maximum(x @ weight + [0.5, -0.5], 0))


def test_python_ensemble_calls_xgboost(client, examples_dir) -> None:
    features = synthetic_features(6, seed=3)
    tensor = httpclient.InferInput("features", [6, 20], "FP32")
    tensor.set_data_from_numpy(features)
    result = client.infer("python-example", [tensor])
    expected = reference_xgb(examples_dir, features)
    np.testing.assert_allclose(result.as_numpy("probability"), expected, rtol=1e-6)
    labels = result.as_numpy("label").reshape(-1)
    assert list(labels) == [b"positive" if p >= 0.5 else b"negative" for p in expected[:, 0]]


def test_requested_output_subset(client: httpclient.InferenceServerClient) -> None:
    tensor = httpclient.InferInput("features", [1, 20], "FP32")
    tensor.set_data_from_numpy(synthetic_features(1))
    result = client.infer("python-example", [tensor],
                          outputs=[httpclient.InferRequestedOutput("label")])
    assert result.as_numpy("label").shape == (1, 1)
    assert result.as_numpy("probability") is None


def test_statistics_count_requests(client: httpclient.InferenceServerClient) -> None:
    before = client.get_inference_statistics("onnx-example")["model_stats"][0]
    tensor = httpclient.InferInput("x", [3, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((3, 4), dtype=np.float32))
    client.infer("onnx-example", [tensor])
    after = client.get_inference_statistics("onnx-example", "1")["model_stats"][0]
    assert after["inference_stats"]["success"]["count"] == \
        before["inference_stats"]["success"]["count"] + 1
    assert after["inference_count"] == before["inference_count"] + 3
    assert after["inference_stats"]["success"]["ns"] > before["inference_stats"]["success"]["ns"]
    every = client.get_inference_statistics()["model_stats"]
    assert {row["name"] for row in every} >= {*CLASSIC, LLM}


def test_concurrent_requests_are_batched(client, kserve_instance: Instance, examples_dir) -> None:
    batches_before = _xgb_batches(client)
    features = synthetic_features(64, seed=11)

    async def run() -> np.ndarray:
        aio = aiohttpclient.InferenceServerClient(kserve_instance.http_url, conn_limit=64)
        try:
            calls = []
            for row in features:
                tensor = aiohttpclient.InferInput("features", [1, 20], "FP32")
                tensor.set_data_from_numpy(row[None])
                calls.append(aio.infer("xgb-example", [tensor]))
            results = await asyncio.gather(*calls)
        finally:
            await aio.close()
        return np.concatenate([r.as_numpy("probability") for r in results])

    scores = asyncio.run(run())
    np.testing.assert_allclose(scores, reference_xgb(examples_dir, features), rtol=1e-6)
    batches = {size: count - batches_before.get(size, 0)
               for size, count in _xgb_batches(client).items()}
    # 64 concurrent requests took fewer than 64 model calls: some shared one
    assert sum(size * n for size, n in batches.items()) == 64
    assert sum(batches.values()) < 64, batches


def _xgb_batches(client: httpclient.InferenceServerClient) -> dict[int, int]:
    stats = client.get_inference_statistics("xgb-example")["model_stats"][0]
    return {row["batch_size"]: int(row["compute_infer"]["count"]) for row in stats["batch_stats"]}


def test_llm_tensors_over_infer(client: httpclient.InferenceServerClient) -> None:
    text = httpclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"The capital of France?"], dtype=object))
    params = httpclient.InferInput("sampling_parameters", [1], "BYTES")
    params.set_data_from_numpy(np.array([json.dumps({"max_tokens": "3",
                                                     "temperature": "0"}).encode()],
                                        dtype=object))
    exclude = httpclient.InferInput("exclude_input_in_output", [1], "BOOL")
    exclude.set_data_from_numpy(np.array([True]))
    result = client.infer(LLM, [text, params, exclude])
    assert result.as_numpy("text_output").tolist() == [b"Paris is the"]
    result = client.infer(LLM, [text])
    assert result.as_numpy("text_output").tolist() == [b"The capital of France?Paris is the "
                                                       b"capital."]


def test_generate_and_generate_stream(kserve_instance: Instance) -> None:
    base = f"http://{kserve_instance.http_url}/v2/models/{LLM}"
    reply = httpx.post(f"{base}/generate", json={
        "text_input": "Capital?", "exclude_input_in_output": True,
        "parameters": {"max_tokens": 2}})
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"model_name": LLM, "model_version": "1", "text_output": "Paris is"}
    with httpx.stream("POST", f"{base}/versions/1/generate_stream",
                      json={"text_input": "Capital?", "parameters": {"max_tokens": 4}}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in r.iter_lines()
                  if line.startswith("data: ")]
    assert [e["text_output"] for e in events] == ["Paris", " is", " the", " capital"]


def test_sampling_fields_reach_the_engine_in_vllms_types(kserve_instance: Instance) -> None:
    # what Triton clients send: every value a string, lists and objects as JSON text
    sampling = {"temperature": "0.1", "top_k": "3", "seed": "7", "ignore_eos": "true",
                "logit_bias": '{"5": 2}', "stop_token_ids": "[9]", "logprobs": "1"}
    reply = httpx.post(f"http://{kserve_instance.http_url}/v2/models/{LLM}/infer", json={"inputs": [
        {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["Capital?"]},
        {"name": "sampling_parameters", "datatype": "BYTES", "shape": [1],
         "data": [json.dumps(sampling)]}]})
    assert reply.status_code == 200, reply.text
    assert kserve_instance.llm is not None
    assert kserve_instance.llm.engine.calls[-1][1] == {
        "temperature": 0.1, "top_k": 3, "seed": 7, "ignore_eos": True, "logit_bias": {5: 2.0},
        "stop_token_ids": [9], "logprobs": 1}


def test_scoring_over_http_json(kserve_instance: Instance) -> None:
    reply = httpx.post(f"http://{kserve_instance.http_url}/v2/models/{LLM}/infer", json={
        "inputs": [
            {"name": "context", "datatype": "BYTES", "shape": [1], "data": ["a b c d e"]},
            {"name": "candidates", "datatype": "BYTES", "shape": [2], "data": ["f g", "h"]},
        ]})
    assert reply.status_code == 200, reply.text
    outputs = {o["name"]: o for o in reply.json()["outputs"]}
    assert outputs["num_tokens"]["data"] == [2, 1]
    assert outputs["token_logprobs"]["shape"] == [2, 2]
    sums = outputs["logprob_sum"]["data"]
    rows = np.array(outputs["token_logprobs"]["data"]).reshape(2, 2)
    np.testing.assert_allclose(sums, [rows[0].sum(), rows[1, 0]], rtol=1e-5)
    assert rows[1, 1] == 0  # padding past the candidate's one token


def test_scoring_route(kserve_instance: Instance) -> None:
    base = f"http://{kserve_instance.http_url}/v2/models/{LLM}"
    reply = httpx.post(f"{base}/score", json={"context": "a b c d e",
                                              "candidates": ["f g", "h"]})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert [len(row) for row in body["token_logprobs"]] == [2, 1]
    np.testing.assert_allclose(body["logprob_sum"], [sum(r) for r in body["token_logprobs"]],
                               rtol=1e-5)
    bad = httpx.post(f"{base}/score", json={"context": "a", "candidates": "b"})
    assert bad.status_code == 400
    assert "'candidates' must be a list" in bad.json()["error"]


def test_embeddings_over_infer(client: httpclient.InferenceServerClient) -> None:
    from tests.support.kserve_instance import EMBEDDER

    metadata = client.get_model_metadata(EMBEDDER)
    assert metadata["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, -1]}]
    texts = httpclient.InferInput("text_input", [2], "BYTES")
    texts.set_data_from_numpy(np.array([b"hello world", b"ok"], dtype=object))
    vectors = client.infer(EMBEDDER, [texts]).as_numpy("embedding")
    assert vectors.dtype == np.float32
    assert vectors.tolist() == [[2, 11, ord("h"), ord("d")], [1, 2, ord("o"), ord("k")]]


def test_repository_index_load_unload(client: httpclient.InferenceServerClient) -> None:
    index = {(row["name"], row["version"]): row for row in client.get_model_repository_index()}
    assert index[("xgb-example", "1")]["state"] == "READY"
    # the LLM example is packaged but not loaded in this instance
    assert index[("smollm2-135m-instruct", "1")]["state"] == "UNAVAILABLE"
    client.unload_model("onnx-example")
    assert not client.is_model_ready("onnx-example")
    with pytest.raises(Exception, match="not served here"):
        client.get_model_metadata("onnx-example")
    client.load_model("onnx-example")
    assert client.is_model_ready("onnx-example")
    with pytest.raises(Exception, match="no package for model 'nope'"):
        client.load_model("nope")


def test_asyncio_client(kserve_instance: Instance, examples_dir) -> None:
    async def run() -> list[np.ndarray]:
        client = aiohttpclient.InferenceServerClient(kserve_instance.http_url)
        try:
            assert await client.is_server_ready()
            features = synthetic_features(8, seed=5)
            calls = []
            for row in features:
                tensor = aiohttpclient.InferInput("features", [1, 20], "FP32")
                tensor.set_data_from_numpy(row[None])
                calls.append(client.infer("xgb-example", [tensor]))
            results = await asyncio.gather(*calls)
            return [features, np.concatenate([r.as_numpy("probability") for r in results])]
        finally:
            await client.close()

    features, scores = asyncio.run(run())
    np.testing.assert_allclose(scores, reference_xgb(examples_dir, features), rtol=1e-6)
