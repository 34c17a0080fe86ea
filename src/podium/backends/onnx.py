"""ONNX models scored in-process with onnxruntime (CPU execution provider)."""

from __future__ import annotations

from typing import Any

from podium.backends.classic import Arrays, ClassicBackend
from podium.errors import PackageError
from podium.package.manifest import TensorSpec

_ORT_TYPES = {
    "tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32", "tensor(uint64)": "UINT64", "tensor(int8)": "INT8",
    "tensor(int16)": "INT16", "tensor(int32)": "INT32", "tensor(int64)": "INT64",
    "tensor(float16)": "FP16", "tensor(float)": "FP32", "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}


class OnnxBackend(ClassicBackend):
    """An onnxruntime session; I/O derived from the graph when the manifest omits it."""

    _session: Any = None

    def _load_model(self) -> None:
        import onnxruntime  # heavy: imported only when an onnx model loads

        options = onnxruntime.SessionOptions()
        # one intra-op thread: concurrency comes from batching, and the box is shared
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = onnxruntime.InferenceSession(
            str(self.package.root / self.manifest.model_file), sess_options=options,
            providers=["CPUExecutionProvider"])

    def _derive_io(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        return ([self._spec(arg) for arg in self._session.get_inputs()],
                [self._spec(arg) for arg in self._session.get_outputs()])

    def _spec(self, arg: Any) -> TensorSpec:
        datatype = _ORT_TYPES.get(arg.type)
        if datatype is None:
            raise PackageError(f"{self.package.root}: ONNX tensor {arg.name!r} has type "
                               f"{arg.type}, which Podium cannot serve")
        dims = [d if isinstance(d, int) and d >= 0 else -1 for d in arg.shape]
        if self.max_batch_size > 0:
            dims = dims[1:]  # the first dimension is the batch
        return TensorSpec(name=arg.name, datatype=datatype, shape=dims)

    def _predict(self, inputs: Arrays) -> Arrays:
        names = [spec.name for spec in self._outputs]
        feeds = {spec.name: inputs[spec.name] for spec in self._inputs}
        return dict(zip(names, self._session.run(names, feeds), strict=True))

    def _release(self) -> None:
        self._session = None
