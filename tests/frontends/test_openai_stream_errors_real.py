"""A request vLLM refuses inside its stream gets its own status, not a 200 whose first event is
the error (the session's shared real instance).

vLLM builds a `response_format` grammar only once the stream has begun; a JSON Schema keyword
its structured-outputs backends do not implement (`uniqueItems`) used to answer `200` with
`data: {"error": ...}` as the first event, so a client reading the status saw success. Podium
reads the first chunk before sending anything: the refusal is a 400 naming `response_format`,
streamed or not, and a good stream follows.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import API_KEY, LLM

pytestmark = pytest.mark.engine
HEADERS = {"authorization": f"Bearer {API_KEY}"}
SCHEMA = {"type": "array", "items": {"type": "string", "enum": ["Heat", "Alien", "Up"]},
          "minItems": 2, "maxItems": 2}


def _chat(schema: dict, stream: bool) -> dict:
    return {"model": LLM, "stream": stream, "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": "Two films, as a JSON array."}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "films", "schema": schema}}}


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_an_unbuildable_grammar_is_a_400_naming_response_format_then_a_stream_serves(
        instance, stream: bool) -> None:
    url = f"{instance.http_url}/v1/chat/completions"
    bad = _chat({**SCHEMA, "uniqueItems": True}, stream)
    r = httpx.post(url, json=bad, headers=HEADERS, timeout=120)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert error["param"] == "response_format" and "uniqueItems" in error["message"], error

    with httpx.stream("POST", url, json=_chat(SCHEMA, True), headers=HEADERS,
                      timeout=120) as good:
        assert good.status_code == 200
        events = [json.loads(line[6:]) for line in good.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    assert events and not any("error" in e for e in events)
    text = "".join((c.get("delta") or {}).get("content") or ""
                   for e in events for c in e.get("choices", []))
    films = json.loads(text)
    assert len(films) == 2 and set(films) <= {"Heat", "Alien", "Up"}
