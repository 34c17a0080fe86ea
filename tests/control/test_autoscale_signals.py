"""The engine signals read from instances' /metrics: parsing, a bounded rate, failed scrapes."""

from __future__ import annotations

import logging

import httpx
import pytest

from podium.control.engine_signals import ScrapeError, SignalReader, parse_reading
from tests.support.fake_metrics import exposition

# vLLM 0.32's own lines, two engines (data parallel) in one instance, among other families
TWO_ENGINES = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="smol"} 2.0
vllm:num_requests_running{engine="1",model_name="smol"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="smol"} 3.0
vllm:num_requests_waiting{engine="1",model_name="smol"} 2.0
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="smol",reason="capacity"} 3.0
vllm:num_requests_waiting_by_reason{engine="1",model_name="smol",reason="capacity"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="smol"} 0.9
vllm:kv_cache_usage_perc{engine="1",model_name="smol"} 0.5
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="smol"} 1234.0
"""


def test_an_instance_waits_the_sum_over_its_engines_and_uses_their_mean_kv_cache() -> None:
    reading = parse_reading(TWO_ENGINES, at_s=7.0)
    assert (reading.waiting, reading.running, reading.at_s) == (5.0, 3.0, 7.0)
    assert reading.kv_cache_usage == pytest.approx(0.7)
    # the exposition the console's tests read as an instance's
    one = parse_reading(exposition(10.0), at_s=0.0)
    assert (one.waiting, one.running, one.kv_cache_usage) == (1.0, 3.0, 0.42)


@pytest.mark.parametrize(("body", "names"), [
    ("# TYPE podium:ready gauge\npodium:ready 1.0\n",
     "vllm:num_requests_waiting or vllm:kv_cache_usage_perc"),
    ('vllm:num_requests_waiting{engine="0"} 0.0\n', "vllm:kv_cache_usage_perc"),
    ("", "vllm:num_requests_waiting"),
], ids=["classic-model", "no-kv-gauge", "empty"])
def test_metrics_without_the_engine_gauges_are_an_error_naming_them(body: str,
                                                                    names: str) -> None:
    with pytest.raises(ScrapeError) as info:
        parse_reading(body, at_s=0.0)
    assert names in str(info.value)


class FakeInstances:
    """Instances' /metrics behind an httpx MockTransport: what each answers, and a count."""

    def __init__(self) -> None:
        self.bodies: dict[str, str | int | Exception] = {}
        self.num_scrapes: dict[str, int] = {}

    def set(self, host: str, *, waiting: float = 0.0, kv: float = 0.0) -> None:
        self.bodies[host] = (f'vllm:num_requests_waiting{{engine="0"}} {waiting}\n'
                             f'vllm:kv_cache_usage_perc{{engine="0"}} {kv}\n')

    def handler(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        self.num_scrapes[host] = self.num_scrapes.get(host, 0) + 1
        assert request.url.path == "/metrics"
        assert request.headers["authorization"] == "Bearer plane-key"
        answer = self.bodies[host]
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, int):
            return httpx.Response(answer, text="no")
        return httpx.Response(200, text=answer)


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def fake() -> FakeInstances:
    return FakeInstances()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def reader(fake: FakeInstances, clock: Clock) -> SignalReader:
    client = httpx.Client(transport=httpx.MockTransport(fake.handler),
                          headers={"Authorization": "Bearer plane-key"})
    return SignalReader(client, interval_s=2.0, clock=clock)


AB = [("m-1-1", "http://a"), ("m-1-2", "http://b")]


def test_each_instance_is_scraped_at_most_once_per_interval(
        reader: SignalReader, fake: FakeInstances, clock: Clock) -> None:
    fake.set("a", waiting=4, kv=0.6)
    fake.set("b", waiting=0, kv=0.2)
    for _ in range(5):  # five loop passes inside one interval
        signals = reader.read(AB)
        clock.now_s += 0.3
    assert fake.num_scrapes == {"a": 1, "b": 1}
    assert (signals.num_serving, signals.num_read, signals.complete) == (2, 2, True)
    assert signals.waiting == 2.0 and signals.kv_cache_usage == pytest.approx(0.4)
    fake.set("a", waiting=10, kv=0.6)
    clock.now_s += 0.6  # 2.1 s after the first scrape
    assert reader.read(AB).waiting == 5.0
    assert fake.num_scrapes == {"a": 2, "b": 2}


@pytest.mark.parametrize("failure", [
    500, 401, httpx.ConnectError("refused"), httpx.ReadTimeout("timed out"),
    "# TYPE podium:ready gauge\npodium:ready 1.0\n",
], ids=["500", "401", "refused", "timeout", "no-engine-gauges"])
def test_a_failed_scrape_is_unread_never_zero(
        reader: SignalReader, fake: FakeInstances, clock: Clock,
        failure: int | Exception | str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "podium.control")
    fake.set("a", waiting=6, kv=0.9)
    fake.set("b", waiting=2, kv=0.5)
    assert reader.read(AB).waiting == 4.0
    fake.bodies["a"] = failure
    # the last good reading of `a` stands for 3 intervals (6 s): a blip changes nothing
    for _ in range(3):
        clock.now_s += 2.0
        signals = reader.read(AB)
        assert (signals.num_read, signals.waiting) == (2, 4.0)
    clock.now_s += 2.0
    signals = reader.read(AB)
    # then only `b` counts: its own values, not a mean with a zero, and the set is incomplete
    assert (signals.num_read, signals.complete, signals.waiting) == (1, False, 2.0)
    assert signals.kv_cache_usage == 0.5
    assert sum("engine signals of m-1-1 not read" in r.message for r in caplog.records) == 1
    # failing, it is still tried only once per interval
    scrapes = fake.num_scrapes["a"]
    reader.read(AB)
    reader.read(AB)
    assert fake.num_scrapes["a"] == scrapes
    # every instance unread: no values at all
    fake.bodies["b"] = 503
    clock.now_s += 10.0
    signals = reader.read(AB)
    assert (signals.num_read, signals.waiting, signals.kv_cache_usage) == (0, None, None)
    # and it comes back
    fake.set("a", waiting=1, kv=0.1)
    fake.set("b", waiting=3, kv=0.3)
    clock.now_s += 2.0
    signals = reader.read(AB)
    assert (signals.num_read, signals.waiting) == (2, 2.0)
    assert any("engine signals of m-1-1 read again" in r.message for r in caplog.records)


def test_a_stopped_instance_is_forgotten(reader: SignalReader, fake: FakeInstances) -> None:
    fake.set("a", waiting=6, kv=0.9)
    reader.read(AB[:1])
    reader.forget("m-1-1")
    reader.read(AB[:1])  # asked again at once: scraped again, nothing was kept
    assert fake.num_scrapes["a"] == 2
    assert reader.read([]).num_serving == 0


def test_a_bad_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval_s=0"):
        SignalReader(httpx.Client(), interval_s=0)
