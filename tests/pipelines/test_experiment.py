"""Sticky allocation: a key stays in its variant; weights hold over many keys."""

from __future__ import annotations

from collections import Counter

from podium.pipelines.steps.experiment import ExperimentStep


def _experiment(salt: str = "rec-2026", weights: tuple[float, ...] = (80, 20)) -> ExperimentStep:
    return ExperimentStep.model_validate({
        "name": "arm", "kind": "experiment", "key": "$input.member_id", "salt": salt,
        "variants": [{"name": f"v{i}", "weight": w} for i, w in enumerate(weights)]})


def test_the_same_key_always_lands_in_the_same_variant() -> None:
    first, again = _experiment(), _experiment()
    for key in ("m1", "42", 42, "member-99"):
        assert first.allocate(key).name == again.allocate(key).name


def test_weights_hold_within_tolerance_over_10000_keys() -> None:
    experiment = _experiment(weights=(70, 20, 10))
    counts = Counter(experiment.allocate(f"member-{i}").name for i in range(10_000))
    assert abs(counts["v0"] / 10_000 - 0.70) < 0.02
    assert abs(counts["v1"] / 10_000 - 0.20) < 0.02
    assert abs(counts["v2"] / 10_000 - 0.10) < 0.02


def test_another_salt_reshuffles_keys() -> None:
    one, other = _experiment("a", (50, 50)), _experiment("b", (50, 50))
    moved = sum(one.allocate(i).name != other.allocate(i).name for i in range(2000))
    assert 800 < moved < 1200  # independent halves: about half the keys move
