"""A python model's bad answers are 500s naming the output and the package, never a 200 with
the wrong shape; the next good request on the same server is served."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from podium.frontends.kserve_http import create_router
from podium.package.package import write_manifest
from podium.repository import ModelRepository

# execute answers the request's `case` input with one of these (each edits a good answer)
MODEL_SOURCE = '''
import numpy as np


def good(batched):
    return {"score": np.array([[0.5]], dtype=np.float32),
            "count": np.array([[2]] if batched else [2], dtype=np.int32),
            "label": np.array([[b"ok"]] if batched else [b"ok"], dtype=object)}


def edit(answer, **changes):
    answer = {**answer, **changes}
    return {k: v for k, v in answer.items() if v is not DROP}


DROP = object()
CASES = {
    "good": lambda a: [a],
    "none": lambda a: [None],
    "dict-instead-of-list": lambda a: a,
    "two-answers-for-one-request": lambda a: [a, a],
    "none-for-output": lambda a: [edit(a, score=None)],
    "str-for-fp32": lambda a: [edit(a, score="high")],
    "dict-for-output": lambda a: [edit(a, score={"value": 0.5})],
    "wrong-shape": lambda a: [edit(a, score=np.zeros(3, dtype=np.float32))],
    "unknown-output": lambda a: [edit(a, scores=a["score"])],
    "missing-output": lambda a: [edit(a, count=DROP)],
    "float-for-int32": lambda a: [edit(a, count=np.array([1.5]))],
    "ragged-lists": lambda a: [edit(a, score=[[1.0], [2.0, 3.0]])],
    "int-for-bytes": lambda a: [edit(a, label=np.array([7], dtype=object))],
    "nan": lambda a: [edit(a, score=np.array([[np.nan]], dtype=np.float32))],
    "wrong-batch-size": lambda a: [edit(a, score=np.zeros((2, 1), dtype=np.float32))],
}


class Model:
    def initialize(self, config):
        self.batched = config["model_config"]["max_batch_size"] > 0

    def execute(self, requests):
        answers = [CASES[r["case"].ravel()[0].decode()](good(self.batched)) for r in requests]
        return answers[0] if len(answers) == 1 else [a[0] for a in answers]
'''
OUTPUTS = [{"name": "score", "datatype": "FP32", "shape": [-1, 1]},
           {"name": "count", "datatype": "INT32", "shape": [1]},
           {"name": "label", "datatype": "BYTES", "shape": [1]}]
BATCHED_OUTPUTS = [{"name": "score", "datatype": "FP32", "shape": [1]},
                   {"name": "count", "datatype": "INT32", "shape": [1]},
                   {"name": "label", "datatype": "BYTES", "shape": [1]}]

# id: (model, case, words the 500's message must contain)
BAD_ANSWERS: dict[str, tuple[str, str, list[str]]] = {
    "none": ("answers", "none", ["answers@1", "response 0 is NoneType"]),
    "dict-instead-of-list": ("answers", "dict-instead-of-list",
                             ["answers@1", "a list of one response per request", "dict"]),
    "two-answers-for-one-request": ("answers", "two-answers-for-one-request",
                                    ["answers@1", "per request (1)", "list of 2"]),
    "none-for-output": ("answers", "none-for-output", ["answers@1", "'score'", "None"]),
    "str-for-fp32": ("answers", "str-for-fp32", ["answers@1", "'score'", "str", "FP32"]),
    "dict-for-output": ("answers", "dict-for-output", ["answers@1", "'score'", "dict"]),
    "wrong-shape": ("answers", "wrong-shape", ["answers@1", "'score'", "[3]", "[-1, 1]"]),
    "unknown-output": ("answers", "unknown-output", ["answers@1", "'scores'", "not declare"]),
    "missing-output": ("answers", "missing-output", ["answers@1", "no output 'count'"]),
    "float-for-int32": ("answers", "float-for-int32",
                        ["answers@1", "'count'", "float64", "INT32"]),
    "ragged-lists": ("answers", "ragged-lists", ["answers@1", "'score'", "rectangular"]),
    "int-for-bytes": ("answers", "int-for-bytes", ["answers@1", "'label'", "int", "BYTES"]),
    "batched-wrong-batch-size": ("answers-batched", "wrong-batch-size",
                                 ["answers-batched@1", "'score'", "[2, 1]", "[1, 1]"]),
    "batched-wrong-shape": ("answers-batched", "wrong-shape",
                            ["answers-batched@1", "'score'", "[3]"]),
    "batched-str-for-fp32": ("answers-batched", "str-for-fp32",
                             ["answers-batched@1", "'score'", "str"]),
}


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    root = tmp_path_factory.mktemp("answers")
    made = []
    for name, outputs, batching in [
            ("answers", OUTPUTS, {"max_batch_size": 0}),
            ("answers-batched", BATCHED_OUTPUTS,
             {"max_batch_size": 4, "dynamic_batching": {"max_queue_delay_us": 20000}})]:
        directory = root / name
        directory.mkdir()
        (directory / "model.py").write_text(MODEL_SOURCE)
        made.append(write_manifest(directory, {
            "name": name, "version": "1", "backend": "python", "module": "model.py",
            "inputs": [{"name": "case", "datatype": "BYTES", "shape": [1]}],
            "outputs": outputs, **batching}))
    return made


def _body(model: str, case: str) -> dict[str, Any]:
    shape = [1, 1] if model == "answers-batched" else [1]
    return {"inputs": [{"name": "case", "datatype": "BYTES", "shape": shape, "data": [case]}]}


async def _serve(packages: list[Any], calls: list[tuple[str, str]]) -> list[httpx.Response]:
    """Load both models, send each (model, case) in turn over KServe HTTP, unload."""
    repository = ModelRepository()
    for package in packages:
        await repository.load(package)
    app = FastAPI()
    app.include_router(create_router(repository, server_ready=repository.all_ready))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://podium") as client:
            return [await asyncio.wait_for(
                client.post(f"/v2/models/{model}/infer", json=_body(model, case)), 10)
                for model, case in calls]
    finally:
        await repository.unload_all(timeout_s=5)


@pytest.mark.parametrize("row", list(BAD_ANSWERS), ids=list(BAD_ANSWERS))
def test_a_bad_answer_is_a_500_naming_the_output_then_good_requests_serve(
        packages: list[Any], row: str) -> None:
    model, case, words = BAD_ANSWERS[row]
    bad, good, other = asyncio.run(_serve(packages, [
        (model, case), (model, "good"),
        ("answers" if model == "answers-batched" else "answers-batched", "good")]))
    assert bad.status_code == 500, bad.text
    message = bad.json()["error"]
    for word in words:
        assert word in message, message
    assert "TypeError" not in message
    assert good.status_code == 200, good.text
    assert other.status_code == 200, other.text


@pytest.mark.parametrize("model", ["answers", "answers-batched"])
def test_nan_is_a_value_not_an_error(packages: list[Any], model: str) -> None:
    (reply,) = asyncio.run(_serve(packages, [(model, "nan")]))
    assert reply.status_code == 200, reply.text
    score = next(o for o in reply.json()["outputs"] if o["name"] == "score")
    assert score["shape"] == [1, 1] and math.isnan(score["data"][0])


def test_good_answers_keep_their_declared_shapes(packages: list[Any], tmp_path: Path) -> None:
    plain, batched = asyncio.run(_serve(packages, [("answers", "good"),
                                                   ("answers-batched", "good")]))
    shapes = {o["name"]: o["shape"] for o in plain.json()["outputs"]}
    assert shapes == {"score": [1, 1], "count": [1], "label": [1]}
    shapes = {o["name"]: o["shape"] for o in batched.json()["outputs"]}
    assert shapes == {"score": [1, 1], "count": [1, 1], "label": [1, 1]}


def test_a_bad_answer_in_a_batch_fails_its_own_request_only(packages: list[Any]) -> None:
    async def together() -> tuple[list[httpx.Response], int]:
        repository = ModelRepository()
        await repository.load(packages[1])
        app = FastAPI()
        app.include_router(create_router(repository, server_ready=repository.all_ready))
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://podium") as client:
                replies = await asyncio.wait_for(asyncio.gather(*(
                    client.post("/v2/models/answers-batched/infer",
                                json=_body("answers-batched", case))
                    for case in ("good", "str-for-fp32", "good"))), 10)
            return list(replies), repository.find("answers-batched").backend.execution_count
        finally:
            await repository.unload_all(timeout_s=5)

    (first, bad, last), executions = asyncio.run(together())
    assert executions == 1  # the three shared one execute call
    assert [first.status_code, bad.status_code, last.status_code] == [200, 500, 200]
    assert "'score'" in bad.json()["error"]
