"""What the OpenAI frontend renders of each kind of answer the backend's service gives: a
response vLLM's serving layer rendered itself (its embeddings answer a starlette Response)
passes through as it is, status and body."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from tests.support.openai_instance import EMBEDDINGS, GOOD, client_for, openai_app


async def test_a_response_vllm_rendered_itself_passes_through() -> None:
    app, serving = openai_app()

    async def rendered(request: Any, raw: Any) -> JSONResponse:
        serving.requests.append(request)
        return JSONResponse({"object": "list", "data": [{"embedding": [0.5]}]},
                            status_code=200, headers={"x-from": "vllm"})

    serving.__class__ = type("Rendering", (type(serving),), {"__call__": staticmethod(rendered)})
    async with client_for(app) as client:
        r = await client.post(EMBEDDINGS, json=GOOD[EMBEDDINGS])
    assert r.status_code == 200, r.text
    assert r.json()["data"] == [{"embedding": [0.5]}] and r.headers["x-from"] == "vllm"
    assert len(serving.requests) == 1
