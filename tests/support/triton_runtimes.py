"""Triton-layout models for the stateful, libtorch and BLS tests: an accumulator with
`sequence_batching`, TorchScript models named by Triton's libtorch convention, and Python
models calling xgb-example and the LLM through BLS."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.triton_layouts import write_model

ACCUMULATOR = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """A running sum per sequence, kept in this instance's memory: a request of a sequence
    that reaches another instance fails (KeyError), so the sums prove the pinning."""

    def initialize(self, args):
        self.instance = args["model_instance_name"]
        self.totals = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            def value(name):
                return pb_utils.get_input_tensor_by_name(request, name).as_numpy()
            corrid = int(value("CORRID")[0])
            assert corrid == request.correlation_id(), (corrid, request.correlation_id())
            start, end, ready = int(value("START")[0]), int(value("END")[0]), value("READY")[0]
            assert ready == 1.0
            assert bool(request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START) \\
                == bool(start)
            if start:
                self.totals[corrid] = 0
            self.totals[corrid] += int(value("INPUT")[0])
            total = self.totals[corrid]
            if end:
                del self.totals[corrid]
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT", np.array([total], dtype=np.int32)),
                pb_utils.Tensor("INSTANCE", np.array([self.instance.encode()], dtype=object))]))
        return responses
'''

ACCUMULATOR_CONFIG = '''
backend: "python"
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "INSTANCE" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
sequence_batching {
  max_sequence_idle_microseconds: 60000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] } ]
  direct { }
}
'''

TORCH_INDEXED_CONFIG = '''
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 1000 }
'''

TORCH_NAMED_CONFIG = '''
backend: "pytorch"
input [ { name: "b" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape { shape: [ 4 ] } },
        { name: "a" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 4 ] } ]
parameters { key: "INFERENCE_MODE" value: { string_value: "false" } }
'''

BLS_XGB = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            features = pb_utils.get_input_tensor_by_name(request, "FEATURES").as_numpy()
            answer = pb_utils.InferenceRequest(
                model_name="xgb-example", requested_output_names=["probability"],
                inputs=[pb_utils.Tensor("features", features)]).exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
                continue
            probability = pb_utils.get_output_tensor_by_name(answer, "probability").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("LABEL", (probability > 0.5).astype(np.int32)),
                pb_utils.Tensor("PROBABILITY", probability)]))
        return responses
'''

BLS_XGB_CONFIG = '''
backend: "python"
max_batch_size: 16
input [ { name: "FEATURES" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "LABEL" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "PROBABILITY" data_type: TYPE_FP32 dims: [ 1 ] } ]
'''

BLS_SEQUENCE = '''
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Forwards each request into the accumulator's sequence of the same id (BLS)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            parameters = json.loads(request.parameters())
            flags = (pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
                     if parameters.get("sequence_start") else 0) | \\
                (pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
                 if parameters.get("sequence_end") else 0)
            answer = pb_utils.InferenceRequest(
                model_name="accumulator", requested_output_names=["OUTPUT"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT")],
                correlation_id=request.correlation_id(), flags=flags).exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.get_output_tensor_by_name(answer, "OUTPUT")]))
        return responses
'''

BLS_SEQUENCE_CONFIG = '''
backend: "python"
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''

BLS_LLM = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Asks the LLM (Triton's vLLM tensors) and answers its text upper-cased."""

    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.llm = parameters["llm"]["string_value"]

    def execute(self, requests):
        responses = []
        for request in requests:
            prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy()
            sampling = json.dumps({"max_tokens": 8, "temperature": 0})
            answer = pb_utils.InferenceRequest(
                model_name=self.llm, requested_output_names=["text_output"],
                inputs=[pb_utils.Tensor("text_input", prompt.reshape(1)),
                        pb_utils.Tensor("sampling_parameters",
                                        np.array([sampling.encode()], dtype=object)),
                        pb_utils.Tensor("exclude_input_in_output", np.array([True]))]).exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
                continue
            text = pb_utils.get_output_tensor_by_name(answer, "text_output").as_numpy()
            text = text.reshape(-1)[0]
            text = text.decode() if isinstance(text, bytes) else str(text)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
                "ANSWER", np.array([text.upper().encode()], dtype=object))]))
        return responses
'''

BLS_LLM_CONFIG = '''
backend: "python"
input [ { name: "PROMPT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "ANSWER" data_type: TYPE_STRING dims: [ 1 ] } ]
parameters { key: "llm" value: { string_value: "%s" } }
'''

VLLM_CONFIG = '''
backend: "vllm"
instance_group [ { count: 1 kind: KIND_MODEL } ]
model_transaction_policy { decoupled: true }
'''

BAD = {
    "bad_sequence_onnx": ('platform: "onnxruntime_onnx"\nsequence_batching { direct {} }\n',
                          "sequence_batching"),
    "bad_control": (ACCUMULATOR_CONFIG.replace(" int32_false_true: [ 0, 1 ]", "", 1),
                    "sequence_batching.control_input 'START'"),
    "bad_oldest": (ACCUMULATOR_CONFIG.replace("direct { }", "oldest { preferred_batch_size: 2 }"),
                   "sequence_batching.oldest.preferred_batch_size"),
    "bad_torch_param": (TORCH_INDEXED_CONFIG + 'parameters { key: "ENABLE_NVFUSER" value: '
                        '{ string_value: "true" } }\n', "parameters.ENABLE_NVFUSER"),
    "bad_torch_output": (TORCH_INDEXED_CONFIG.replace('"OUTPUT__1"', '"DIFF"'), "output.name"),
    "bad_torch_input": (TORCH_INDEXED_CONFIG.replace('"INPUT__1"', '"INPUT__2"'), "input.name"),
}
"""Refused models: config → the field their load error names."""


def write_torchscript(path: Path) -> None:
    """forward(a, b) → (a + b, a - b), scripted."""
    import torch

    class AddSub(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return a + b, a - b

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(AddSub()), str(path))


def write_runtime_repository(root: Path) -> Path:
    """The accumulator, two TorchScript models, BLS over xgb-example (with it), refused ones."""
    from podium.examples.builders import write_xgb_example

    write_model(root, "accumulator", ACCUMULATOR_CONFIG, ACCUMULATOR)
    for name, config in (("torch_add_sub", TORCH_INDEXED_CONFIG),
                         ("torch_named", TORCH_NAMED_CONFIG), *(
                             (n, c) for n, (c, _) in BAD.items() if "torch" in n)):
        write_model(root, name, config)
        write_torchscript(root / name / "1" / "model.pt")
    for name, (config, _) in BAD.items():
        if "torch" not in name:
            write_model(root, name, config, ACCUMULATOR)
    write_model(root, "bls_xgb", BLS_XGB_CONFIG, BLS_XGB)
    write_model(root, "bls_sequence", BLS_SEQUENCE_CONFIG, BLS_SEQUENCE)
    write_xgb_example(root / "xgb-example")
    return root


def write_llm_repository(root: Path, llm: str, weights: Path) -> Path:
    """The default LLM as a Triton vLLM-backend model (`1/model.json` pointing at its cached
    folder) and a Python model that calls it through BLS."""
    write_model(root, llm, VLLM_CONFIG)
    (root / llm / "1" / "model.json").write_text(json.dumps(
        {"model": str(weights), "max_model_len": 8192, "disable_log_requests": True}))
    write_model(root, "bls_llm", BLS_LLM_CONFIG % llm, BLS_LLM)
    return root
