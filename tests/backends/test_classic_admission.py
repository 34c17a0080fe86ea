"""A classic model's in-flight bound from its measured completions per busy second: the rate
(busy time only, refusals not counted, old work fading), the bound within its floor and
ceiling, where the target wait comes from, and what the backend answers and shows."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from podium.backends import create_backend
from podium.backends.base import InferenceRequest, InferenceResponse, Tensor
from podium.backends.classic_admission import (
    FLOOR,
    MEASURED_FLOOR,
    MIN_COMPLETIONS,
    SATURATED_DEPTH,
    TAIL_EVERY,
    WINDOW_S,
    BusyRate,
    ClassicAdmission,
    bound,
    tail_factor,
)
from podium.backends.limits import InstanceLimits
from podium.errors import InvalidArgument, PackageError
from podium.examples.builders import synthetic_features, write_xgb_example
from podium.frontends.kserve_http import encode_infer_response
from podium.package.manifest import parse_manifest
from podium.package.package import open_package, write_manifest
from podium.server.config import ServerConfig


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def serve_one(rate: BusyRate, clock: Clock, seconds: float, *, completed: bool = True) -> None:
    rate.started()
    clock.now += seconds
    rate.finished(completed=completed)


def test_no_rate_until_enough_requests_were_measured() -> None:
    clock = Clock()
    rate = BusyRate(clock)
    for _ in range(MIN_COMPLETIONS - 1):
        serve_one(rate, clock, 0.01)
    assert rate.rate() is None
    serve_one(rate, clock, 0.01)
    assert rate.rate() == pytest.approx(100.0)


def test_idle_time_between_requests_does_not_count() -> None:
    clock = Clock()
    rate = BusyRate(clock)
    for _ in range(MIN_COMPLETIONS):
        serve_one(rate, clock, 0.002)
        clock.now += 1.0  # idle: no request in the backend
    assert rate.rate() == pytest.approx(500.0)


def test_overlapping_requests_count_their_busy_time_once() -> None:
    clock = Clock()
    rate = BusyRate(clock)
    for _ in range(MIN_COMPLETIONS // 4):  # four at a time, all done in 0.01 s
        for _ in range(4):
            rate.started()
        clock.now += 0.01
        for _ in range(4):
            rate.finished()
    assert rate.in_flight == 0
    assert rate.rate() == pytest.approx(400.0)


def test_refused_requests_spend_busy_time_but_are_no_completions() -> None:
    clock = Clock()
    rate = BusyRate(clock)
    for _ in range(MIN_COMPLETIONS):
        serve_one(rate, clock, 0.01)
        serve_one(rate, clock, 0.01, completed=False)
    assert rate.measured == MIN_COMPLETIONS
    assert rate.rate() == pytest.approx(50.0)


def test_old_work_fades_once_the_window_is_full() -> None:
    clock = Clock()
    rate = BusyRate(clock)
    while clock.now - 100.0 < 2 * WINDOW_S:  # slow at first: 10 a second
        serve_one(rate, clock, 0.1)
    while clock.now - 100.0 < 6 * WINDOW_S:  # then 1000 a second
        serve_one(rate, clock, 0.001)
    assert rate.rate() == pytest.approx(1000.0, rel=0.05)


def test_the_bound_is_the_work_done_in_the_target_wait_within_floor_and_ceiling() -> None:
    assert bound(None, 0.02, 1088) == FLOOR  # not measured: the floor
    assert bound(2000.0, 0.02, 1088) == 40
    assert bound(600.0, 0.02, 1088) == FLOOR  # slow, measured at light load: the floor
    saturated = SATURATED_DEPTH
    assert bound(600.0, 0.02, 1088, depth=saturated) == 12  # saturated: below the floor
    assert bound(100.0, 0.02, 1088, depth=saturated) == MEASURED_FLOOR  # never below that
    assert bound(1e6, 0.02, 1088) == 1088  # fast: never past the queue plus one batch
    assert bound(None, 0.02, 5) == 5  # a queue smaller than the floor caps it too
    assert bound(100.0, 0.02, 3, depth=saturated) == 3  # and the measured floor


def test_the_tail_factor_is_the_mean_time_over_its_90th_percentile() -> None:
    assert tail_factor([]) == 1.0  # nothing measured: no correction
    assert tail_factor([0.01] * 50) == pytest.approx(1.0)  # alike: rate x wait as it was
    times = [0.01] * 80 + [0.04] * 20  # mean 0.016, 90th percentile 0.04
    assert tail_factor(times) == pytest.approx(0.4)
    assert tail_factor([0.0, 0.0]) == 1.0  # no time at all: no correction
    assert bound(2000.0, 0.02, 1088, tail=0.5) == 20  # half the rate x wait of 40
    assert bound(2000.0, 0.02, 1088, tail=0.1) == FLOOR  # never below the floor
    assert bound(2000.0, 0.02, 1088, tail=0.1, depth=SATURATED_DEPTH) == MEASURED_FLOOR


def test_a_long_tail_lowers_the_bound_and_an_even_one_does_not() -> None:
    """2048 completions a second (rate x wait 40), one request in five taking 5x the rest:
    the bound follows the tail; the same rate without a tail keeps 40."""
    def run(tailed: bool) -> ClassicAdmission:
        clock = Clock()
        admission = ClassicAdmission(0.02, 1088, "default", clock)
        for i in range(MIN_COMPLETIONS + 4 * TAIL_EVERY):
            since = admission.busy.started()
            clock.now += 1 / 2048
            # the request's own time: not the busy clock's (requests overlap in a batch)
            admission.finished(since=since - (0.004 if tailed and i % 5 == 0 else 0.0))
        return admission

    even, tailed = run(False), run(True)
    assert even.bound == 40 and even.tail == pytest.approx(1.0)
    assert tailed.tail < 0.5 and tailed.bound == max(FLOOR, int(2048 * 0.02 * tailed.tail))
    assert tailed.bound < even.bound
    assert tailed.as_dict()["tail_factor"] == round(tailed.tail, 3)
    assert f"tail factor {tailed.tail:.2f}" in tailed.describe("m@1")


def test_the_first_measurement_and_large_changes_are_logged() -> None:
    clock = Clock()
    admission = ClassicAdmission(0.02, 1088, "default", clock)
    assert admission.bound == FLOOR and "not measured yet" in admission.describe("m@1")
    logged = []
    for _ in range(MIN_COMPLETIONS + 10):
        admission.busy.started()
        clock.now += 1 / 2048  # 2048 a second: 40.96 in 0.02 s
        logged.append(admission.finished())
    assert admission.bound == 40
    assert logged.index(True) == MIN_COMPLETIONS - 1 and logged.count(True) == 1
    line = admission.describe("m@1")
    assert "in-flight bound 40 for a 0.02s target wait (default)" in line
    assert "measured 2048 completions per busy second" in line
    assert admission.as_dict()["in_flight_bound"] == 40


def serve_held(admission: ClassicAdmission, clock: Clock, held: int, rate: float,
               seconds: float) -> None:
    """`held` requests in the backend at once for `seconds`, one finishing every 1 / `rate`
    s and another entering in its place."""
    entered = [admission.busy.started() for _ in range(held)]
    start = clock.now
    while clock.now - start < seconds:
        clock.now += 1 / rate
        admission.finished(since=entered.pop(0))
        entered.append(admission.busy.started())
    for since in entered:
        admission.finished(since=since)


def test_the_depth_is_the_mean_in_the_backend_while_busy() -> None:
    clock = Clock()
    rate = BusyRate(clock)
    assert rate.depth() == 0.0
    first = rate.started()
    clock.now += 0.01  # one alone for 10 ms
    rate.started()
    clock.now += 0.01  # then two for 10 ms
    rate.finished()
    rate.finished()
    clock.now += 1.0  # idle: not busy, so not counted
    assert first == 100.0 and rate.depth() == pytest.approx(1.5)


@pytest.mark.parametrize(("held", "expected"), [
    pytest.param(12, 12, id="saturated-12-deep: below the floor"),
    pytest.param(2, FLOOR, id="two-deep: a light-load rate, the floor"),
])
def test_a_slow_rate_bounds_below_the_floor_only_when_the_backend_was_saturated(
        held: int, expected: int) -> None:
    """600 a second (rate x wait 12): a starved instance with 12 in its backend is admitted
    12, not the 16 that would wait 16 / 600 s; the same rate with two in the backend is the
    rate of requests with little company, and the floor holds."""
    clock = Clock()
    admission = ClassicAdmission(0.02, 1088, "default", clock)
    serve_held(admission, clock, held, 600.0, 3 * WINDOW_S)
    assert admission.busy.depth() == pytest.approx(held, rel=0.05)
    assert admission.tail == pytest.approx(1.0)  # every request took as long
    assert admission.bound == expected
    assert admission.as_dict()["depth"] == pytest.approx(held, rel=0.05)


def test_a_saturated_bound_grows_back_past_the_floor_when_the_instance_speeds_up() -> None:
    clock = Clock()
    admission = ClassicAdmission(0.02, 1088, "default", clock)
    serve_held(admission, clock, 12, 600.0, 3 * WINDOW_S)
    assert admission.bound == 12
    serve_held(admission, clock, 12, 2048.0, 6 * WINDOW_S)
    assert admission.bound == pytest.approx(41, abs=3)  # 2048 x 0.02: the slow ones faded


def test_the_config_shows_the_requests_in_the_backend_now() -> None:
    clock = Clock()
    admission = ClassicAdmission(0.02, 1088, "default", clock)
    first = admission.busy.started()
    admission.busy.started()
    assert admission.as_dict()["in_flight"] == 2
    admission.finished(since=first)
    assert admission.as_dict()["in_flight"] == 1


def package(tmp_path: Path, **manifest: object) -> Path:
    root = write_xgb_example(tmp_path / "xgb-example")
    if manifest:
        data = json.loads((root / "podium.json").read_text())
        write_manifest(root, {**data, **manifest})
    return root


async def loaded(root: Path, limits: InstanceLimits) -> object:
    backend = create_backend(open_package(root))
    backend.limits = limits
    await backend.load()
    return backend


@pytest.mark.parametrize(("flag", "manifest", "expected"), [
    (None, {}, (0.02, "default")),
    (None, {"admission_target_wait_s": 0.5}, (0.5, "package")),
    (0.1, {"admission_target_wait_s": 0.5}, (0.1, "flag")),
])
def test_the_target_wait_is_the_flags_else_the_packages_else_the_default(
        tmp_path: Path, flag: float | None, manifest: dict, expected: tuple) -> None:
    async def run() -> dict:
        backend = await loaded(package(tmp_path, **manifest),
                               InstanceLimits(classic_target_wait_s=flag, max_queue=100))
        try:
            return backend.config()["admission"]  # type: ignore[attr-defined]
        finally:
            await backend.unload()  # type: ignore[attr-defined]
    admission = asyncio.run(run())
    assert (admission["target_wait_s"], admission["target_wait_source"]) == expected
    assert admission["ceiling"] == 100 + 64  # --max-queue plus one batch of xgb-example


def test_each_answer_carries_the_bound_and_the_kserve_answer_sends_it(tmp_path: Path) -> None:
    async def run() -> tuple[list[InferenceResponse], dict]:
        backend = await loaded(package(tmp_path, admission_target_wait_s=5.0), InstanceLimits())
        try:
            features = synthetic_features(1, seed=3)
            answers = [await backend.infer(InferenceRequest(  # type: ignore[attr-defined]
                {"features": Tensor("features", "FP32", features)}))
                for _ in range(MIN_COMPLETIONS)]
            return answers, backend.config()["admission"]  # type: ignore[attr-defined]
        finally:
            await backend.unload()  # type: ignore[attr-defined]
    answers, admission = asyncio.run(run())
    assert answers[0].admission_bound == FLOOR  # before the measurement
    assert admission["measured_requests"] == MIN_COMPLETIONS
    assert answers[-1].admission_bound == admission["in_flight_bound"] > FLOOR
    http = encode_infer_response(answers[-1], model="xgb-example", version="1",
                                 binary_outputs={}, default_binary=False)
    assert http.headers["podium-admission-bound"] == str(admission["in_flight_bound"])
    plain = InferenceResponse(outputs=[Tensor("y", "FP32", np.zeros((1, 1), np.float32))])
    assert "podium-admission-bound" not in encode_infer_response(
        plain, model="m", version="1", binary_outputs={}, default_binary=False).headers


def test_a_bad_target_wait_is_refused_naming_the_field_then_a_good_one_is_taken() -> None:
    with pytest.raises(PackageError, match="admission_target_wait_s"):
        parse_manifest({"name": "m", "backend": "xgboost", "admission_target_wait_s": 0})
    assert parse_manifest({"name": "m", "backend": "xgboost",
                           "admission_target_wait_s": 0.05}).admission_target_wait_s == 0.05
    with pytest.raises(InvalidArgument, match="--classic-target-wait-s"):
        ServerConfig(classic_target_wait_s=-1.0)
    config = ServerConfig(classic_target_wait_s=0.05)
    assert config.instance_limits().classic_target_wait_s == 0.05


def test_podium_inspect_shows_how_a_classic_packages_bound_is_set(tmp_path: Path) -> None:
    root = package(tmp_path, admission_target_wait_s=0.5,
                   dynamic_batching={"max_queue": 10})
    shown = subprocess.run([sys.executable, "-m", "podium.cli", "inspect", "--json", str(root)],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    admission = json.loads(shown.stdout)["admission"]
    assert (admission["target_wait_s"], admission["target_wait_source"]) == (0.5, "package")
    assert (admission["floor"], admission["measured_floor"], admission["ceiling"]) == \
        (FLOOR, MEASURED_FLOOR, 10 + 64)
    table = subprocess.run([sys.executable, "-m", "podium.cli", "inspect", str(root)],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "COLUMNS": "200"})
    assert ("completions per busy second x 0.5 s (package), between 16 and 74 (down to 4 "
            "when measured saturated)") in table.stdout
