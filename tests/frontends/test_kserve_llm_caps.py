"""KServe generation is capped like the OpenAI routes: `n` by the package's max_n (else
`--max-n`), stop / stop_token_ids / bad_words by `--max-stop-strings` and `--max-stop-chars`.
Each refusal is a 400 naming the field, the value, the cap and the setting to change, on HTTP
generate and gRPC, before the engine sees the request; a good request follows on the same
server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.support.fake_llm_instance import llm_instance

CONFIGURED = {"max_n": 4, "max_stop_strings": 3, "max_stop_chars": 8}


class Capped(NamedTuple):
    params: dict[str, Any]
    says: list[str]
    param: str
    manifest: dict[str, Any] = {}


CASES = {
    "n-over-max-n-flag": Capped({"n": 5}, ["n=5", "cap of 4", "--max-n"], "n"),
    "n-over-package-max-n": Capped({"n": 3}, ["n=3", "cap of 2", "max_n in the package"],
                                   "n", {"max_n": 2}),
    "n-within-package-max-n-over-flag": Capped({"n": 9}, ["n=9", "cap of 8"], "n",
                                               {"max_n": 8}),
    "stop-count": Capped({"stop": ["a", "b", "c", "d"]},
                         ["stop has 4 entries", "limit of 3", "--max-stop-strings"], "stop"),
    "stop-chars": Capped({"stop": ["abcdefghi"]},
                         ["9 characters", "limit of 8", "--max-stop-chars"], "stop"),
    "one-stop-string-too-long": Capped({"stop": "abcdefghijk"}, ["11 characters"], "stop"),
    "bad-words-count": Capped({"bad_words": ["a", "b", "c", "d"]},
                              ["bad_words has 4 entries", "--max-stop-strings"], "bad_words"),
    "bad-words-chars": Capped({"bad_words": ["x" * 9]}, ["limit of 8"], "bad_words"),
    "stop-token-ids-count": Capped({"stop_token_ids": [1, 2, 3, 4]},
                                   ["stop_token_ids has 4 entries", "limit of 3"],
                                   "stop_token_ids"),
}


def _grpc_request(params: dict[str, Any]) -> Any:
    request = service_pb2.ModelInferRequest(model_name="llm")
    for name, value in (("text_input", "hello there"), ("sampling_parameters",
                                                          json.dumps(params))):
        tensor = request.inputs.add(name=name, datatype="BYTES", shape=[1])
        tensor.contents.bytes_contents.append(value.encode())
    return request


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
async def test_each_cap_is_the_instances_or_the_packages(tmp_path: Path, case: Capped) -> None:
    async with llm_instance(tmp_path, case.manifest, **CONFIGURED) as (client, engine, target):
        r = await client.post("/v2/models/llm/generate",
                              json={"text_input": "hello there", "parameters": case.params})
        assert r.status_code == 400, r.text
        for word in case.says:
            assert word in r.json()["error"], r.json()
        async with grpc.aio.insecure_channel(target) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ModelInfer(_grpc_request(case.params), timeout=10)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert case.says[0] in refused.value.details()
        assert engine.calls == []  # refused before the engine
        good = await client.post("/v2/models/llm/generate", json={"text_input": "hello there"})
        assert good.status_code == 200 and good.json()["text_output"], good.text


async def test_requests_at_the_caps_are_served(tmp_path: Path) -> None:
    async with llm_instance(tmp_path, **CONFIGURED) as (client, engine, _):
        params = {"n": 4, "stop": ["abcdefgh", "b", "c"], "bad_words": ["x"],
                  "stop_token_ids": [1, 2, 3]}
        r = await client.post("/v2/models/llm/generate",
                              json={"text_input": "hello there", "parameters": params})
        assert r.status_code == 200, r.text
        assert len(r.json()["text_output"]) == 4
        assert engine.calls[0][1]["n"] == 4
