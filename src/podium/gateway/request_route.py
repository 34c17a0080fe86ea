"""Which model and version a request names: OpenAI `model` field, the KServe v2 path or a
pipeline's JSON path."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from podium.edge.inflate import inflate
from podium.errors import InvalidArgument, NotFound
from podium.errors.render import OPENAI_OUTSIDE_V1
from podium.gateway.limits import DEFAULT_MAX_BODY_BYTES
from podium.gateway.prefix_key import PrefixKey, kserve_key, openai_key
from podium.routes.table import Endpoint

KSERVE_PATH = re.compile(
    r"^/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?(?P<rest>/.*)?$")
"""A KServe v2 model path: its model, the version it names (if any) and the rest."""
PIPELINE_PATH = re.compile(r"^/pipelines/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?$")
"""A pipeline's plain JSON route (`frontends.pipeline_json`): its name and version (if any)."""


@dataclass(frozen=True)
class RequestRoute:
    """The model a request is for, the version it asked for (None: any), and how to forward it."""

    model: str
    version: str | None
    body: bytes
    kind: str
    """`openai`, `kserve` or `pipeline`: decides how the path is rewritten for a resolved
    version."""
    inflated: bool = False
    """The body is forwarded decompressed: its Content-Encoding must not be."""
    prefix: PrefixKey | None = None
    """The prompt an LLM request starts with, for routing by cache (None: not an LLM prompt)."""

    def check_served_by(self, version: str, endpoint: Endpoint, path: str) -> None:
        """An OpenAI request for a standalone deployment is refused (404 naming its mode)
        before it is sent: the instance serves KServe v2 only."""
        if self.kind == "openai" and endpoint.frontends == "standalone":
            raise NotFound(
                f"{self.model}@{version} is deployed standalone (its package sets "
                "\"frontends\": \"standalone\"): it serves KServe v2 only, over HTTP (POST "
                f"/v2/models/{self.model}/generate or /infer) and gRPC, not the OpenAI API "
                f"({path}); package it with \"frontends\": \"embedded\" to serve /v1",
                param="model")

    def upstream_path(self, path: str, version: str, *, pinned: bool = False) -> str:
        """The path to send upstream once the version is resolved (aliases replaced; always
        named when `pinned`: a LoRA adapter's instance serves all its versions)."""
        if self.kind == "kserve" and (self.version is not None or pinned):
            match = KSERVE_PATH.match(path)
            assert match is not None
            return f"/v2/models/{self.model}/versions/{version}{match['rest'] or ''}"
        if self.kind == "pipeline" and (self.version is not None or pinned):
            return f"/pipelines/{self.model}/versions/{version}"
        return path


    def upstream_body(self, version: str, *, pinned: bool = False) -> bytes:
        """The body to send upstream: an OpenAI request for a LoRA adapter (`pinned`) names
        `name@version`, since one base instance serves every placed version of it."""
        if not pinned or self.kind != "openai":
            return self.body
        data = json.loads(self.body)
        data["model"] = f"{self.model}@{version}"
        return json.dumps(data).encode()


def route_of(method: str, path: str, body: bytes, *, content_encoding: str = "",
             max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> RequestRoute:
    """Read the model (and version) from the KServe path or the OpenAI JSON body (inflated
    first when compressed, up to `max_body_bytes`)."""
    match = KSERVE_PATH.match(path)
    if match:
        addressed = (f"{match['model']}@{match['version']}" if match["version"]
                     else match["model"])
        prefix = (kserve_key(match["rest"], body, model=addressed)
                  if method == "POST" and not content_encoding else None)
        return RequestRoute(match["model"], match["version"], body, "kserve", prefix=prefix)
    match = PIPELINE_PATH.match(path)
    if match:  # split, admitted and counted like KServe: only the path differs
        return RequestRoute(match["model"], match["version"], body, "pipeline")
    if (path.startswith("/v1/") or path in OPENAI_OUTSIDE_V1) and method == "POST":
        plain = inflate(body, content_encoding, max_body_bytes)
        route = _openai(path, plain)
        return RequestRoute(route.model, route.version, route.body, route.kind,
                            inflated=plain is not body, prefix=route.prefix)
    raise NotFound(f"{method} {path} is not routed by the gateway; use /v1 (OpenAI), "
                   f"{', '.join(OPENAI_OUTSIDE_V1)} (vLLM's, with 'model') or "
                   "/v2/models/{model} (KServe v2) or /pipelines/{name} (a pipeline's JSON)",
                   param="path")


def _openai(path: str, body: bytes) -> RequestRoute:
    try:
        data = json.loads(body or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"request body is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InvalidArgument("request body must be a JSON object")
    name = data.get("model")
    if not isinstance(name, str) or not name:
        raise InvalidArgument("field 'model' is required: the model name, or name@version",
                              param="model")
    model, _, version = name.partition("@")
    if "@" in name:
        if not model or not version:
            raise InvalidArgument(f"model={name!r}: use name@version, e.g. iris@2",
                                  param="model")
        # the instance knows the model by its name: the version was only for routing
        data["model"] = model
        body = json.dumps(data).encode()
    return RequestRoute(model, version or None, body, "openai",
                        prefix=openai_key(path, data, model=name))
