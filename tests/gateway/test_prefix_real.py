"""Two real instances of the default LLM behind a gateway: a shared system prompt stays on one
instance (its engine's prefix cache hits), a different one goes to the other.

The suite's shared instance is one of the two; the second boots here (about 30 s). A handful of
short requests, sent one at a time. Then the second instance is killed outright (SIGKILL) and
its engine must stop itself.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from podium.gateway.proxy import Gateway
from podium.routes.table import Endpoint
from tests.conftest import API_KEY, LLM
from tests.support.harness import RunningInstance, running_instance
from tests.support.polling import eventually
from tests.support.servers import Served

pytestmark = pytest.mark.engine  # the shared instance and a second one

WORDS = ["ship", "harbor", "lantern", "tide", "compass", "anchor", "rope", "sail", "storm",
         "island", "map", "coin"]
PER_PREFIX = 3


def system_prompt(seed: int) -> str:
    """About 600 tokens of text nobody else sends (four of the engine's 128-token blocks)."""
    rng = random.Random(seed)
    return "You answer in one word. " + " ".join(rng.choice(WORDS) for _ in range(600))


@pytest.fixture(scope="module")
def second(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningInstance]:
    """Another instance of the default package, with the shared one's key."""
    from podium.package.defaults import write_default_package

    package = write_default_package(tmp_path_factory.mktemp("package") / LLM)
    log = Path(tmp_path_factory.mktemp("logs")) / "second.log"
    with running_instance([str(package.root), "--metrics-open"], log,
                          api_key=API_KEY) as running:
        yield running


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


def test_a_killed_server_takes_its_engine_with_it(second: RunningInstance) -> None:
    """SIGKILL (the OOM killer, a supervisor) gives the server no chance to stop its engine:
    the engine core sees its server gone and stops itself, aborting what it ran. Before, it
    kept running with its KV cache for good.

    Last in this module, on its second instance (done serving): the suite starts no engine
    for it alone (tests/server/test_shutdown.py holds the other shutdown paths)."""
    children = psutil.Process(second.process.pid).children(recursive=True)
    assert children, "the engine core runs in a child process"
    body = {"model": LLM, "prompt": "Tell a story:", "max_tokens": 400, "ignore_eos": True}

    def generate() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the server is killed under it
            httpx.post(f"{second.openai_url}/completions", json=body, headers=second.headers(),
                       timeout=60)

    request = threading.Thread(target=generate)
    request.start()
    try:
        assert eventually(lambda: _in_flight(second) >= 1, timeout_s=60), "never generating"
        second.process.kill()
        second.process.wait(10)
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"engine processes outlived their server: {alive}"
        assert "that started this engine core is gone" in second.log()
        request.join(30)
    finally:
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()


def _in_flight(running: RunningInstance) -> float:
    """The completions the server is serving now (its own in-flight gauge)."""
    text = httpx.get(f"{running.http_url}/metrics", headers=running.headers(), timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("podium:requests_in_flight{")
               and 'endpoint="/v1/completions"' in line)
