"""The gateway's HTTP proxy routes LLM prompts by prefix: two loopback instances, real requests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from podium.gateway.prefix_router import PrefixPolicy
from podium.gateway.proxy import Gateway
from podium.routes.table import Endpoint
from tests.support.servers import Served, upstream

PIRATE = "You are a pirate. Answer every question in pirate speech, briefly. " * 10
POET = "You are a poet. Answer every question as a rhyming couplet, nothing else. " * 10


@pytest.fixture(scope="module")
def instances() -> Iterator[dict[str, Served]]:
    served = {name: Served(upstream(name)) for name in ("a", "b")}
    yield served
    for instance in served.values():
        instance.stop()


def front(instances: dict[str, Served], prefix: PrefixPolicy | None) -> tuple[Served, Gateway]:
    gateway = Gateway(prefix=prefix)
    for name, instance in instances.items():
        gateway.table.add_endpoint("llm", "1", Endpoint(f"llm-{name}", instance.url))
    gateway.table.set_split("llm", {"1": 100})
    return Served(gateway.app()), gateway


def ask(client: httpx.Client, system: str, question: str) -> str:
    """Which instance answered a chat request with this system prompt."""
    r = client.post("/v1/chat/completions", json={"model": "llm", "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": question}]})
    assert r.status_code == 200, r.text
    return r.json()["version"]


@pytest.mark.parametrize("policy", [PrefixPolicy(), None], ids=["prefix", "least-in-flight"])
def test_requests_sharing_a_system_prompt_land_on_one_instance(
        instances: dict[str, Served], policy: PrefixPolicy | None) -> None:
    served, _ = front(instances, policy)
    try:
        with httpx.Client(base_url=served.url, timeout=10) as client:
            pirate = [ask(client, PIRATE, f"question {i}?") for i in range(4)]
            poet = [ask(client, POET, f"question {i}?") for i in range(4)]
            metrics = client.get("/metrics").text
    finally:
        served.stop()
    if policy is None:  # without it, ties go round robin: each prompt is prefilled twice
        assert Counter(pirate) == Counter(poet) == {"a": 2, "b": 2}
        assert "podium:gateway_prefix_picks_total{" not in metrics
        return
    assert len(set(pirate)) == 1 and len(set(poet)) == 1
    assert pirate[0] != poet[0]  # a second prefix goes where nothing is cached yet
    assert ('podium:gateway_prefix_picks_total{model="llm",outcome="affinity",version="1"} 6.0'
            in metrics)
    assert 'podium:gateway_prefix_picks_total{model="llm",outcome="cold",version="1"} 2.0' \
        in metrics


def test_an_instance_that_refuses_connections_hands_its_prefixes_to_a_sibling(
        instances: dict[str, Served]) -> None:
    served, gateway = front(instances, PrefixPolicy())
    try:
        with httpx.Client(base_url=served.url, timeout=10) as client:
            held = ask(client, PIRATE, "first?")
            gone = gateway.table.endpoint(f"llm-{held}")
            gone.url = "http://127.0.0.1:9"  # nothing listens: the connection is refused
            other = ask(client, PIRATE, "second?")  # retried on the sibling
            gone.url, gone.healthy = instances[held].url, True  # back, with an empty cache
            assert [ask(client, PIRATE, f"again {i}?") for i in range(3)] == [other] * 3
    finally:
        served.stop()
    assert other != held
