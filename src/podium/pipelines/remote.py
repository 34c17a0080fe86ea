"""Models not served by this instance, called over KServe v2 HTTP (the gateway or an instance).

One `httpx.AsyncClient` per process; the step's W3C `traceparent`, the request id and the key
in PODIUM_PIPELINE_GATEWAY_KEY travel as headers, so the model's own logs and spans join the
pipeline's trace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from podium.backends.base import InferenceRequest
from podium.errors import RequestTimeout, UpstreamFailed
from podium.pipelines.tensors import to_value

if TYPE_CHECKING:
    import httpx

    from podium.pipelines.steps.base import CallContext

_client: httpx.AsyncClient | None = None


def client() -> httpx.AsyncClient:
    import httpx

    global _client
    if _client is None:
        _client = httpx.AsyncClient(limits=httpx.Limits(max_connections=256))
    return _client


async def infer(base_url: str, name: str, version: str | None, request: InferenceRequest,
                call: CallContext) -> dict[str, Any]:
    """Score `request` on name@version at `base_url`; outputs by name as nested lists."""
    import httpx

    path = f"/v2/models/{name}" + (f"/versions/{version}" if version else "") + "/infer"
    body: dict[str, Any] = {"inputs": [
        {"name": t.name, "datatype": t.datatype, "shape": t.shape, "data": to_value(t)}
        for t in request.inputs.values()]}
    if request.requested_outputs is not None:
        body["outputs"] = [{"name": n} for n in request.requested_outputs]
    from podium import env

    headers = {"x-request-id": call.request_id}
    key = env.pipeline_gateway_key()
    if key:
        headers["authorization"] = f"Bearer {key}"
    if call.traceparent:
        headers["traceparent"] = call.traceparent
    try:
        answer = await client().post(base_url.rstrip("/") + path, json=body, headers=headers,
                                     timeout=call.timeout_s)
    except httpx.TimeoutException:
        raise RequestTimeout(f"model {name!r} at {base_url} did not answer in time") from None
    except httpx.HTTPError as exc:
        raise UpstreamFailed(f"model {name!r} at {base_url}: {type(exc).__name__}: {exc}"
                             ) from None
    if answer.status_code != 200:
        raise UpstreamFailed(f"model {name!r} at {base_url} answered {answer.status_code}: "
                             f"{answer.text[:300]}")
    outputs = {}
    for item in answer.json().get("outputs", []):
        data = item.get("data", [])
        if item.get("datatype") != "BYTES":
            data = np.asarray(data).reshape(item.get("shape", [-1])).tolist()
        else:
            data = np.array(data, dtype=object).reshape(item.get("shape", [-1])).tolist()
        outputs[item["name"]] = data
    return outputs
