"""python-example: an ensemble that scores with another loaded model, then labels the result.

Shipped as the package's model.py by `podium examples create`; a template for python models.
"""

import numpy as np


class Model:
    """Calls `parameters.scorer` (xgb-example) once per batch, then thresholds its output."""

    def initialize(self, config):
        self.models = config["models"]
        self.scorer = config["parameters"]["scorer"]
        self.threshold = float(config["parameters"]["threshold"])

    def execute(self, requests):
        # one downstream call for the whole batch: concatenate, score, split
        sizes = [len(r["features"]) for r in requests]
        features = np.concatenate([r["features"] for r in requests]).astype(np.float32)
        probability = self.models.infer(self.scorer, {"features": features})["probability"]
        responses = []
        for part in np.split(probability, np.cumsum(sizes)[:-1]):
            labels = np.where(part >= self.threshold, b"positive", b"negative").astype(object)
            responses.append({"probability": part, "label": labels})
        return responses

    def finalize(self):
        self.models = None
