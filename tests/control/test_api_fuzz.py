"""Schema-driven fuzzing of the control API (schemathesis, in-process over ASGI).

Every operation in `/openapi.json` gets requests that fit the schema and requests that do not
(wrong types, out-of-range numbers, odd strings, extra fields), from a fixed seed. None may get
a 5xx, and after each one the same app still serves a good request.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from podium.control.api import create_app
from podium.control.plane import ControlPlane
from podium.control.store import Store
from tests.support.control_api import Env, deployed
from tests.support.fake_world import FakeWorld

MAX_EXAMPLES = 30  # per operation; the whole file takes about 25 s of CPU (11 operations)


def _schema() -> schemathesis.BaseSchema:
    """The API's schema, read once from an app over an empty in-memory store."""
    store = Store.open("sqlite://")
    try:
        app = create_app(ControlPlane(store, FakeWorld(), materialize=lambda _p: None))
        loaded = schemathesis.openapi.from_asgi("/openapi.json", app)
    finally:
        store.close()
    loaded.config.generation.update(modes=["positive", "negative"], max_examples=MAX_EXAMPLES,
                                    deterministic=True)
    return loaded


schema = _schema()


@pytest.fixture
def fuzz_env(tmp_path: Path) -> Iterator[Env]:
    env = Env(tmp_path)
    deployed(env)  # iris@1 serving, iris@2 announced: routes have something real to act on
    yield env
    env.store.close()


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case: schemathesis.Case, fuzz_env: Env) -> None:
    response = case.call(app=fuzz_env.client.app)  # the same app the good request goes to
    assert response.status_code < 500, (
        f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:500]}"
        f"\nreproduce: {case.as_curl_command()}")
    if response.status_code >= 400 and response.status_code != 401:
        assert "error" in response.json() or "detail" in response.json()
    good = fuzz_env.client.get("/v1/status")
    assert good.status_code == 200 and "models" in good.json()
