"""The imported python package's shim (podium/triton/shim.py) answers as `podium serve
--repository` does: a response carrying a `TritonError` fails its own request of a batch only,
and BLS (`exec()`, `async_exec()`) reaches the other models the instance serves."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from podium.backends.base import InferenceRequest, Tensor
from podium.errors import BackendError, InvalidArgument
from podium.package.package import open_package
from podium.repository import ModelRepository
from podium.triton.import_cmd import import_model
from tests.support.harness import running_instance
from tests.support.triton_layouts import ADD_SUB, ADD_SUB_CONFIG, BLS, BLS_CONFIG, write_model

CHECKED = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x < 0).any():
                error = pb_utils.TritonError("X must not be negative",
                                             pb_utils.TritonError.INVALID_ARG)
            elif (x == 0).all():
                error = pb_utils.TritonError("zero X broke the model")
            else:
                responses.append(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("Y", x * 2),
                    pb_utils.Tensor("BATCH", np.array([[len(requests)]], dtype=np.int32))]))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
        return responses
'''

CHECKED_CONFIG = '''
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] },
         { name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 1000000 }
'''

ASYNC_BLS = BLS.replace("    def execute(self, requests):", "    async def execute(self, requests):"
                        ).replace("answer = call.exec()", "answer = await call.async_exec()")


def _request(**arrays: np.ndarray) -> InferenceRequest:
    return InferenceRequest(inputs={n: Tensor(n, "FP32", a) for n, a in arrays.items()})


async def test_an_error_response_fails_its_own_request_not_its_batch(tmp_path: Path) -> None:
    write_model(tmp_path / "repo", "checked", CHECKED_CONFIG, CHECKED)
    import_model(tmp_path / "repo" / "checked", tmp_path / "pkg")
    repository = ModelRepository()
    await repository.load(open_package(tmp_path / "pkg"))
    try:
        rows = [np.array([[1, 2]], np.float32), np.array([[-1, 2]], np.float32),
                np.array([[0, 0]], np.float32), np.array([[3, 4]], np.float32)]
        answers = await asyncio.gather(*[repository.infer("checked", None, _request(X=x))
                                         for x in rows], return_exceptions=True)
        good = [{t.name: t.data for t in answers[i].outputs} for i in (0, 3)]
        assert [int(g["BATCH"][0][0]) for g in good] == [4, 4]  # all four in one batch
        np.testing.assert_array_equal(good[0]["Y"], rows[0] * 2)
        np.testing.assert_array_equal(good[1]["Y"], rows[3] * 2)
        assert isinstance(answers[1], InvalidArgument)  # a 400, as --repository answers
        assert "X must not be negative" in answers[1].message
        assert isinstance(answers[2], BackendError)  # INTERNAL: a 500
        assert "zero X broke the model" in answers[2].message
        alone = await repository.infer("checked", None, _request(X=rows[3]))  # still serving
        np.testing.assert_array_equal(alone.outputs[0].data, rows[3] * 2)
    finally:
        await repository.unload_all()


@pytest.mark.parametrize("model", [BLS, ASYNC_BLS], ids=["exec", "async_exec"])
async def test_bls_calls_reach_the_models_the_instance_serves(tmp_path: Path,
                                                              model: str) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "add_sub", ADD_SUB_CONFIG.replace(
        "instance_group [ { kind: KIND_CPU count: 2 } ]", ""), ADD_SUB)
    write_model(repo, "bls", BLS_CONFIG, model)
    import_model(repo / "add_sub", tmp_path / "add_sub")
    import_model(repo / "bls", tmp_path / "bls")
    repository = ModelRepository()
    await repository.load(open_package(tmp_path / "add_sub"))
    await repository.load(open_package(tmp_path / "bls"))
    try:
        x = np.array([1, 2, 3, 4], dtype=np.float32)
        response = await repository.infer("bls", None, _request(X=x))
        np.testing.assert_array_equal(response.outputs[0].data, x + x)
        with pytest.raises(BackendError, match="negative input"):  # add_sub's error, re-raised
            await repository.infer("bls", None, _request(X=-x))
        response = await repository.infer("bls", None, _request(X=x * 3))
        np.testing.assert_array_equal(response.outputs[0].data, x * 6)
    finally:
        await repository.unload_all()


def test_served_package_answers_each_request_with_its_own_status(tmp_path: Path) -> None:
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    write_model(tmp_path / "repo", "checked", CHECKED_CONFIG, CHECKED)
    import_model(tmp_path / "repo" / "checked", tmp_path / "pkg")
    with running_instance([str(tmp_path / "pkg")], tmp_path / "serve.log") as server:
        client = httpclient.InferenceServerClient(server.http_url.removeprefix("http://"),
                                                  concurrency=4)
        rows = [np.array([[1, 2]], np.float32), np.array([[-1, 2]], np.float32),
                np.array([[0, 0]], np.float32), np.array([[3, 4]], np.float32)]
        pending = []
        for row in rows:
            tensor = httpclient.InferInput("X", list(row.shape), "FP32")
            tensor.set_data_from_numpy(row)
            pending.append(client.async_infer("checked", [tensor]))
        answers = []
        for call in pending:
            try:
                answers.append(call.get_result())
            except InferenceServerException as exc:
                answers.append(exc)
        np.testing.assert_array_equal(answers[0].as_numpy("Y"), rows[0] * 2)
        np.testing.assert_array_equal(answers[3].as_numpy("Y"), rows[3] * 2)
        assert answers[1].status() == "400" and "X must not be negative" in answers[1].message()
        assert answers[2].status() == "500" and "zero X broke the model" in answers[2].message()
        client.close()
