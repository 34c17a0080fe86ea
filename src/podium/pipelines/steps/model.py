"""`model`: call a model Podium serves, by `name` or `name@version`.

A model served by this instance is called in-process through the repository (no network
hop); any other is called over KServe v2 HTTP at the pipeline's `gateway_url` (the gateway or
an instance), with the step span's W3C `traceparent`. Two forms:

- tensors: `inputs` maps input names to values or references (`datatypes` overrides the
  default of FP32 for floats, INT64 for ints, BYTES for strings); result: output name → value.
- LLM: `prompt` (a `str.format` template over `vars`) with optional `constraint` (e.g.
  `distinct_items` over this member's candidates) and `sampling`; result:
  `{"text": ..., "json": <text parsed as JSON, or null>}`.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, PrivateAttr, model_validator

from podium.backends.base import InferenceRequest
from podium.errors import BackendError, InvalidArgument, PackageError
from podium.pipelines import remote
from podium.pipelines.refs import parse
from podium.pipelines.steps.base import CallContext, StepEnv, StepSpec, split_model
from podium.pipelines.tensors import to_tensor, to_value


class ModelStep(StepSpec):
    """One model call."""

    kind: Literal["model"]
    model: str = Field(description="`name` or `name@version` (or a reference to one, e.g. "
                       "`$arm.params.model`).")
    via: Literal["auto", "local", "remote"] = Field(
        default="auto", description="auto: in-process when this instance serves the model, "
        "else over the network; local / remote force one.")
    inputs: dict[str, Any] | None = Field(default=None, description="Tensor inputs.")
    datatypes: dict[str, str] = Field(default_factory=dict)
    outputs: list[str] | None = Field(default=None, description="Outputs to keep (all: None).")
    prompt: str | None = Field(default=None, description="LLM prompt template.")
    vars: dict[str, Any] = Field(default_factory=dict, description="The prompt's fields.")
    constraint: dict[str, Any] | None = Field(default=None)
    sampling: dict[str, Any] = Field(default_factory=dict,
                                     description="Sampling parameters (max_tokens, ...).")
    _env: StepEnv | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _one_form(self) -> ModelStep:
        if (self.inputs is None) == (self.prompt is None):
            raise ValueError("give either `inputs` (tensors) or `prompt` (an LLM), not both")
        return self

    def settings(self) -> dict[str, Any]:
        return {"model": self.model, "inputs": self.inputs, "vars": self.vars,
                "constraint": self.constraint, "sampling": self.sampling}

    def models(self) -> list[str]:
        return [] if parse(self.model) is not None else [self.model]

    def prepare(self, env: StepEnv) -> None:
        self._env = env
        if parse(self.model) is None:
            self._where(self.model)  # a model that does not exist anywhere fails the load

    async def run(self, args: dict[str, Any], call: CallContext) -> Any:
        target = args["model"]
        if not isinstance(target, str):
            raise InvalidArgument(f"step {self.name!r}: model reference {self.model!r} "
                                  f"resolved to {target!r}, not a model name")
        request = self._request(args)
        where = self._where(target)
        name, version = split_model(target)
        if where == "local":
            response = await self._env.models.infer(name, version, request)  # type: ignore
            outputs = {t.name: to_value(t) for t in response.outputs}
        else:
            outputs = await remote.infer(self._env.gateway_url, name, version, request,  # type: ignore
                                         call)
        if self.prompt is not None:
            return _llm_result(outputs)
        return outputs if self.outputs is None else {k: outputs.get(k) for k in self.outputs}

    def _request(self, args: dict[str, Any]) -> InferenceRequest:
        if self.prompt is None:
            tensors = {name: to_tensor(name, value, self.datatypes.get(name))
                       for name, value in (args["inputs"] or {}).items()}
            return InferenceRequest(inputs=tensors, requested_outputs=self.outputs)
        try:
            prompt = self.prompt.format_map(_Fields(args["vars"]))
        except (KeyError, IndexError, ValueError) as exc:
            raise InvalidArgument(f"step {self.name!r}: prompt template: {exc}") from None
        sampling = dict(args["sampling"] or {})
        if args["constraint"] is not None:
            sampling["constraint"] = args["constraint"]
        tensors = {"text_input": to_tensor("text_input", [prompt], "BYTES"),
                   "exclude_input_in_output": to_tensor("exclude_input_in_output", [True])}
        if sampling:
            tensors["sampling_parameters"] = to_tensor("sampling_parameters",
                                                       [json.dumps(sampling)], "BYTES")
        return InferenceRequest(inputs=tensors)

    def _where(self, target: str) -> str:
        env = self._env
        assert env is not None
        name, version = split_model(target)
        here = env.models is not None and env.models.has_model(name, version)
        if self.via == "local" or (self.via == "auto" and here):
            if not here:
                raise PackageError(f"step {self.name!r}: model {target!r} is not served in "
                                   "this instance (via=local)", param=self.name)
            return "local"
        if env.gateway_url is None:
            raise PackageError(f"step {self.name!r}: model {target!r} does not exist in this "
                               "instance and the pipeline has no `gateway_url` to call it "
                               "through", param=self.name)
        return "remote"


class _Fields(dict):  # type: ignore[type-arg]
    """Template fields: lists and dicts render as JSON (titles keep their quotes)."""

    def __getitem__(self, key: str) -> Any:
        value = super().__getitem__(key)
        return json.dumps(value) if isinstance(value, list | dict) else value


def _llm_result(outputs: dict[str, Any]) -> dict[str, Any]:
    text = outputs.get("text_output")
    while isinstance(text, list) and text:
        text = text[0]
    if not isinstance(text, str):
        raise BackendError(f"the LLM answered no text_output (outputs: {sorted(outputs)})")
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    return {"text": text, "json": parsed}
