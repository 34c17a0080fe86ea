"""The streaming usage contract on the real engine, every combination: `stream_options`
absent or with `include_usage` absent / false / true x `continuous_usage_stats` absent / false /
true, chat and completions, n = 1 and 2. As `vllm serve` streams it (vLLM's
`should_include_usage`, the OpenAI contract): no chunk carries usage unless `include_usage` is
true; then one last chunk with no choices carries the whole request's usage, and with
`continuous_usage_stats` every chunk carries the usage so far too."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import API_KEY, LLM
from tests.support.harness import RunningInstance

pytestmark = pytest.mark.engine
UNSET = object()
"""The key absent from `stream_options` (no `stream_options` at all when both are)."""


def _options(include: Any, continuous: Any) -> dict[str, Any] | None:
    options = {name: value for name, value in (("include_usage", include),
                                               ("continuous_usage_stats", continuous))
               if value is not UNSET}
    return options or None


def _name(value: Any) -> str:
    return "absent" if value is UNSET else str(value).lower()


CASES = [pytest.param(include, continuous,
                      id=f"include_{_name(include)}-continuous_{_name(continuous)}")
         for include in (UNSET, False, True) for continuous in (UNSET, False, True)]


def _stream(instance: RunningInstance, path: str, n: int,
            options: dict[str, Any] | None) -> list[dict[str, Any]]:
    # vLLM refuses n > 1 with greedy sampling
    body: dict[str, Any] = {"model": LLM, "temperature": 0 if n == 1 else 1.0,
                            "max_tokens": 3, "n": n, "stream": True}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "Say three words."}]
    else:
        body["prompt"] = "One, two,"
    if options is not None:
        body["stream_options"] = options
    r = httpx.post(instance.http_url + path, json=body, timeout=120,
                   headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 200, r.text
    lines = [line.removeprefix("data: ") for line in r.text.splitlines()
             if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize(("include", "continuous"), CASES)
def test_usage_chunks_as_vllm_serve_streams_them(instance: RunningInstance, path: str,
                                                 n: int, include: Any,
                                                 continuous: Any) -> None:
    chunks = _stream(instance, path, n, _options(include, continuous))
    if include is not True:
        assert all(chunk.get("usage") is None for chunk in chunks), chunks
        return
    *body, last = chunks
    assert last["choices"] == []
    usage = last["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["completion_tokens"] >= n  # at least one token per sequence, all counted
    if continuous is True:
        assert all(chunk.get("usage") is not None for chunk in body), body
        assert all(c["usage"]["prompt_tokens"] == usage["prompt_tokens"] for c in body)
        # the usage so far (with n = 2, of the chunk's own choice): never past the total
        assert all(c["usage"]["completion_tokens"] <= usage["completion_tokens"] for c in body)
    else:
        assert all(chunk.get("usage") is None for chunk in body), body
