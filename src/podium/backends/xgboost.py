"""XGBoost boosters (JSON or UBJ) scored in-process with `inplace_predict`."""

from __future__ import annotations

from typing import Any

import numpy as np

from podium.backends.classic import Arrays, ClassicBackend
from podium.package.manifest import TensorSpec


class XGBoostBackend(ClassicBackend):
    """One FP32 feature matrix in, one prediction tensor out.

    Derived I/O follows Triton's FIL backend: `input__0` FP32 [num_features] →
    `output__0` FP32 [1] (or [num_classes] for multi-class boosters).
    """

    _booster: Any = None

    def _load_model(self) -> None:
        import xgboost  # heavy: imported only when an xgboost model loads

        booster = xgboost.Booster()
        booster.load_model(str(self.package.root / self.manifest.model_file))
        # one thread per call: concurrency comes from batching, and the box is shared
        booster.set_param({"nthread": 1})
        self._booster = booster

    def _derive_io(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        num_features = int(self._booster.num_features())
        probe = self._booster.inplace_predict(np.zeros((1, num_features), dtype=np.float32))
        width = list(probe.shape[1:]) or [1]
        return ([TensorSpec(name="input__0", datatype="FP32", shape=[num_features])],
                [TensorSpec(name="output__0", datatype="FP32", shape=width)])

    def _predict(self, inputs: Arrays) -> Arrays:
        features = inputs[self._inputs[0].name]
        if self.max_batch_size == 0:  # no batch dimension on the wire: score one row
            features = features.reshape(1, -1)
        scores = self._booster.inplace_predict(features)
        output = self._outputs[0]
        shape = ([scores.shape[0]] if self.max_batch_size else []) + list(output.shape)
        return {output.name: scores.reshape(shape)}

    def _release(self) -> None:
        self._booster = None
