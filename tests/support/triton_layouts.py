"""Triton-layout model repositories written by the tests: config.pbtxt + numbered versions."""

from __future__ import annotations

from pathlib import Path

ADD_SUB = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.config = json.loads(args["model_config"])
        self.args = args
        out = pb_utils.get_output_config_by_name(self.config, "OUTPUT0")
        self.dtype = pb_utils.triton_string_to_numpy(out["data_type"])
        pb_utils.Logger.log_info("add_sub initialized")

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if (a < 0).any():
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError("negative input")))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (a + b).astype(self.dtype)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(self.dtype))]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info("add_sub finalized")
'''

ADD_SUB_CONFIG = '''
name: "add_sub"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
parameters { key: "greeting" value: { string_value: "hello" } }
'''

REPEAT = '''
import threading
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            for i in range(n):
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUT", np.array([i], dtype=np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

REPEAT_CONFIG = '''
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''

META = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("META", np.array(
            [json.dumps([r.request_id(), json.loads(r.parameters()),
                         [t.name() for t in r.inputs()]]).encode()], dtype=object))])
            for r in requests]
'''

META_CONFIG = '''
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "META" data_type: TYPE_STRING dims: [ 1 ] } ]
'''

BLS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            call = pb_utils.InferenceRequest(
                model_name="add_sub", requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", x)])
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            doubled = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("Y", doubled)]))
        return responses
'''

BLS_CONFIG = '''
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
'''

SCALE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "SCALED", pb_utils.get_input_tensor_by_name(r, "RAW").as_numpy() * 2)])
            for r in requests]
'''

SCALE_CONFIG = '''
backend: "python"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "SCALED" data_type: TYPE_FP32 dims: [ 3 ] } ]
'''

ONNX_CONFIG = '''
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 2000
                   default_queue_policy { max_queue_size: 64 } }
version_policy { all {} }
'''

ENSEMBLE_CONFIG = '''
platform: "ensemble"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "RESULT" data_type: TYPE_FP32 dims: [ 3 ] } ]
ensemble_scheduling { step [
  { model_name: "scale" model_version: -1
    input_map { key: "RAW" value: "RAW" } output_map { key: "SCALED" value: "scaled" } },
  { model_name: "onnx_add" model_version: -1
    input_map { key: "x" value: "scaled" } output_map { key: "y" value: "RESULT" } } ] }
'''

BAD = {
    "bad_backend": ('backend: "tensorrt"\n', None),
    "bad_field": (SCALE_CONFIG + 'optimization { cuda { graphs: true } }\n', SCALE),
    "bad_gpu": (SCALE_CONFIG + 'instance_group [ { kind: KIND_GPU } ]\n', SCALE),
    "bad_syntax": ('backend: "python"\ninput [ { name: "X" \n', SCALE),
    "bad_dims": (ONNX_CONFIG.replace("dims: [ 3 ] }", "dims: [ 5 ] }", 1), "onnx"),
}


def write_onnx(path: Path, add: float) -> None:
    """y = x + add, with a dynamic batch dimension."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["y"])], "add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor("c", TensorProto.FLOAT, [3], [add] * 3)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def write_model(root: Path, name: str, config: str, model_py: str | None = None,
                versions: tuple[str, ...] = ("1",)) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config)
    for version in versions:
        (folder / version).mkdir()
        if model_py is not None:
            (folder / version / "model.py").write_text(model_py)


def write_repository(root: Path) -> Path:
    write_model(root, "add_sub", ADD_SUB_CONFIG, ADD_SUB)
    write_model(root, "repeat", REPEAT_CONFIG, REPEAT)
    write_model(root, "bls", BLS_CONFIG, BLS)
    write_model(root, "meta", META_CONFIG, META)
    write_model(root, "scale", SCALE_CONFIG, SCALE)
    write_model(root, "onnx_add", ONNX_CONFIG, versions=("1", "2"))
    write_onnx(root / "onnx_add" / "1" / "model.onnx", 1.0)
    write_onnx(root / "onnx_add" / "2" / "model.onnx", 10.0)
    write_model(root, "pipeline", ENSEMBLE_CONFIG)
    for name, (config, model) in BAD.items():
        write_model(root, name, config, None if model in (None, "onnx") else model)
        if model == "onnx":
            write_onnx(root / name / "1" / "model.onnx", 1.0)
    return root
