"""Generated JSON bodies posted to the three OpenAI routes: none gets a 5xx, and the same app
answers a good request after each.

The instance's OpenAPI does not describe these bodies (the routes read raw JSON, so vLLM's
own models and Podium's checks stay the one source of truth), so schema-driven fuzzing
(`tests/server/test_app_fuzz.py`) reaches them only without a body. Here hypothesis builds the
bodies instead: every honoured field, with values of random JSON type and nesting, huge
integers, strings holding lone surrogates, invalid UTF-8 bytes and nesting past the depth limit.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from podium.backends.vllm.openai_fields import HONOURED
from tests.support.openai_instance import CHAT, COMPLETIONS, EMBEDDINGS, GOOD, openai_app

MAX_EXAMPLES = 120  # per route; the file takes about 35 s on a busy 2-core machine

TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=12)
"""Any code point, lone surrogates included (JSON carries them as \\udxxx escapes)."""
SCALARS = (st.none() | st.booleans() | TEXT | st.sampled_from(["user", "json_schema", "1"])
           | st.integers(min_value=-(2**70), max_value=2**70) | st.integers(-3, 40)
           | st.floats(allow_nan=False, allow_infinity=False))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(TEXT | st.sampled_from(["role", "content", "type",
                                                              "schema", "json_schema"]),
                                      inner, max_size=4), max_leaves=12)


def _bodies(path: str) -> st.SearchStrategy[dict[str, Any]]:
    fields = sorted(HONOURED[path] - {"model"})
    return st.fixed_dictionaries(
        {"model": st.just("fake-llm") | JSON},
        optional={name: JSON | st.just(GOOD[path].get(name)) for name in fields})


def _encoded(body: dict[str, Any], draw: Any) -> bytes:
    """The body as JSON bytes, sometimes broken: bytes that are not UTF-8, or deep nesting."""
    raw = json.dumps(body).encode()
    how = draw(st.sampled_from(["plain"] * 6 + ["bad-utf8", "deep"]))
    if how == "bad-utf8" and b'"' in raw[1:]:
        at = raw.index(b'"', 1) + 1
        raw = raw[:at] + draw(st.binary(min_size=1, max_size=3)).replace(b'"', b"") + raw[at:]
    elif how == "deep":
        depth = draw(st.integers(60, 3000))
        raw = raw[:-1] + (b', "stop": ' if len(body) else b'"stop": ') + b"[" * depth \
            + b"]" * depth + b"}"
    return raw


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    app, _ = openai_app()
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, EMBEDDINGS],
                         ids=["chat", "completions", "embeddings"])
def test_no_generated_body_gets_a_server_error(client: TestClient, path: str) -> None:
    @settings(max_examples=MAX_EXAMPLES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body=_bodies(path), data=st.data())
    def one(body: dict[str, Any], data: st.DataObject) -> None:
        raw = _encoded(body, data.draw)
        r = client.post(path, content=raw, headers={"content-type": "application/json"})
        assert r.status_code < 500, f"{path} {raw[:400]!r} -> {r.status_code}: {r.text[:500]}"
        if r.status_code >= 400:
            error = r.json()["error"]
            assert error["code"] == r.status_code and error["message"]
        good = client.post(path, json=GOOD[path])
        assert good.status_code == 200, good.text

    one()
