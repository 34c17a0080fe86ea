"""Two real instances of the default LLM behind a gateway: a shared system prompt stays on one
instance (its engine's prefix cache hits), a different one goes to the other.

The suite's shared instance is one of the two, its spare instance (tests/support/spare.py) the
other. A handful of short requests, sent one at a time.
"""

from __future__ import annotations

import random

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from podium.gateway.proxy import Gateway
from podium.routes.table import Endpoint
from tests.conftest import LLM
from tests.support.harness import RunningInstance
from tests.support.servers import Served
from tests.support.spare import Spare

pytestmark = pytest.mark.engine  # the shared instance and the spare one

WORDS = ["ship", "harbor", "lantern", "tide", "compass", "anchor", "rope", "sail", "storm",
         "island", "map", "coin"]
PER_PREFIX = 3


def system_prompt(seed: int) -> str:
    """About 600 tokens of text nobody else sends (four of the engine's 128-token blocks)."""
    rng = random.Random(seed)
    return "You answer in one word. " + " ".join(rng.choice(WORDS) for _ in range(600))


@pytest.fixture
def second(spare_instance: Spare) -> RunningInstance:
    """Another instance of the default package (no key: it takes the shared one's too)."""
    return spare_instance.get()


def counts(instance: RunningInstance) -> dict[str, float]:
    """The LLM's finished requests and prefix cache hits (tokens) on one instance."""
    text = httpx.get(f"{instance.http_url}/metrics", headers=instance.headers(), timeout=10).text
    totals = {"requests": 0.0, "hits": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model_name") not in (None, LLM):
                continue
            if sample.name == "vllm:request_success_total":
                totals["requests"] += sample.value
            elif sample.name == "vllm:prefix_cache_hits_total":
                totals["hits"] += sample.value
    return totals


def test_a_shared_system_prompt_stays_on_the_instance_that_caches_it(
        instance: RunningInstance, second: RunningInstance) -> None:
    pair = {"shared": instance, "second": second}
    gateway = Gateway()
    for name, running in pair.items():
        gateway.table.add_endpoint(LLM, "1", Endpoint(name, running.http_url))
    gateway.table.set_split(LLM, {"1": 100})
    served = Served(gateway.app())
    before = {name: counts(running) for name, running in pair.items()}
    prompts = [system_prompt(seed) for seed in (random.randrange(1 << 30), 7 + (1 << 30))]
    try:
        with httpx.Client(base_url=served.url, headers=instance.headers(), timeout=300) as client:
            for system in prompts:
                for i in range(PER_PREFIX):
                    r = client.post("/v1/chat/completions", json={
                        "model": LLM, "max_tokens": 2, "temperature": 0, "messages": [
                            {"role": "system", "content": system},
                            {"role": "user", "content": f"Question {i}: which word?"}]})
                    assert r.status_code == 200, r.text
    finally:
        served.stop()
    after = {name: counts(running) for name, running in pair.items()}
    served_by = {name: after[name]["requests"] - before[name]["requests"] for name in pair}
    hits = {name: after[name]["hits"] - before[name]["hits"] for name in pair}
    # each prompt's requests went to one instance, and the two prompts to different ones
    assert served_by == {"shared": PER_PREFIX, "second": PER_PREFIX}, served_by
    # and there every request after the first found the system prompt cached
    for name in pair:
        assert hits[name] >= (PER_PREFIX - 1) * 3 * 128, (name, hits)
