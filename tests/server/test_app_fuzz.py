"""Schema-driven fuzzing of an instance's HTTP API (schemathesis, in-process over ASGI).

Every operation in the instance's `/openapi.json` (health, `/v1`, KServe v2) gets requests
that fit the schema and requests that do not, from a fixed seed, against one ready fake LLM.
None may get a 5xx, and after each one the same app answers a good chat completion.

The OpenAI routes read their bodies as raw JSON (vLLM's models and Podium's checks validate
them), so the schema describes no body for them and schemathesis sends them none: the
generated bodies are `tests/frontends/test_openai_fuzz.py`'s work.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from starlette.testclient import TestClient

from tests.support.openai_instance import CHAT, GOOD, openai_app

MAX_EXAMPLES = 10  # per operation (31 of them); the file takes about 30 s


def _schema() -> schemathesis.BaseSchema:
    app, _ = openai_app()
    loaded = schemathesis.openapi.from_asgi("/openapi.json", app)
    loaded.config.generation.update(modes=["positive", "negative"], max_examples=MAX_EXAMPLES,
                                    deterministic=True)
    return loaded


schema = _schema()


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    app, _ = openai_app()
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case: schemathesis.Case, client: TestClient) -> None:
    response = case.call(app=client.app)  # the same app the good request goes to
    assert response.status_code < 500, (
        f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:500]}"
        f"\nreproduce: {case.as_curl_command()}")
    good = client.post(CHAT, json=GOOD[CHAT])
    assert good.status_code == 200, good.text
