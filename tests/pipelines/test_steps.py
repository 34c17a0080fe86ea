"""Each step kind on fakes (a fake model host, a SQLite catalog), through a whole pipeline."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from podium.errors import InvalidArgument, RequestTimeout
from tests.support.pipelines import build

SQL = "sqlite:///catalog.db"
RECOMMEND = [
    {"name": "arm", "kind": "experiment", "key": "$input.member_id", "salt": "t",
     "variants": [{"name": "control", "weight": 1, "params": {"top": 2}},
                  {"name": "treatment", "weight": 1}]},
    {"name": "member", "kind": "features", "keys": "$input.member_id", "columns": ["genre"],
     "source": {"type": "sql", "url": SQL, "table": "members", "key_column": "member_id"},
     "defaults": {"genre": "comedy"}},
    {"name": "cands", "kind": "candidates", "key": "$member.row.genre", "item_column": "title",
     "source": {"type": "sql", "url": SQL, "table": "titles", "key_column": "genre"}},
    {"name": "feats", "kind": "features", "keys": "$cands.items", "columns": ["f0", "f1"],
     "source": {"type": "sql", "url": SQL, "table": "titles", "key_column": "title",
                "batch_size": 1}},
    {"name": "rank", "kind": "model", "model": "scorer", "when_variant": ["control"],
     "inputs": {"features": "$feats.matrix"}},
    {"name": "pick", "kind": "model", "model": "llm", "when_variant": ["treatment"],
     "prompt": "Pick 2 of {titles}", "vars": {"titles": "$cands.items"},
     "constraint": {"type": "distinct_items", "items": "$cands.items", "min": 2, "max": 2}},
    {"name": "post", "kind": "python", "function": "post.py:finish",
     "args": {"items": "$cands.items", "scores": "$rank.probability", "picked": "$pick.json"}},
]
POST = '''
def finish(items, scores, picked):
    if picked is not None:
        return {"titles": picked}
    ranked = sorted(zip(items, [s[0] for s in scores]), key=lambda p: -p[1])
    return {"titles": [t for t, _ in ranked[:2]]}
'''
OUTPUTS = [{"name": "titles", "datatype": "BYTES", "shape": [-1], "from": "$post.titles"},
           {"name": "variant", "datatype": "BYTES", "shape": [1], "from": "$arm.variant"}]


@pytest.fixture
def recommend(tmp_path: Path, catalog: Path, models):
    (tmp_path / "post.py").write_text(POST)
    return build(tmp_path, models, RECOMMEND, outputs=OUTPUTS)


def _run(pipeline, member: str):
    return asyncio.run(pipeline.run({"member_id": member}, "req-1"))


def _key_for(pipeline, variant: str, genre_known: bool = True) -> str:
    experiment = pipeline.graph.steps["arm"]
    pool = ["m1"] if genre_known else [f"new{i}" for i in range(100)]
    for key in pool:
        if experiment.allocate(key).name == variant:
            return key
    raise AssertionError(f"no key of the pool lands in {variant}")


def test_control_ranks_candidates_from_sql_with_the_in_process_model(recommend, models) -> None:
    key = _key_for(recommend, "control", genre_known=False)
    result = _run(recommend, key)  # unknown member: genre from defaults (comedy)
    assert result.variant == "control"
    assert result.outputs["titles"] == ["Delta"]
    assert result.results["member"]["missing"] == [key]
    assert models.calls == [("scorer", None)]


def test_the_drama_member_gets_the_two_best_scored_titles(recommend) -> None:
    experiment = recommend.graph.steps["arm"]
    result = _run(recommend, "m1")
    if experiment.allocate("m1").name == "control":
        assert result.outputs["titles"] == ["Beta", "Gamma"]  # f0+f1: 1.8, 0.6, 0.3
    else:
        assert result.outputs["titles"] == ["Alpha", "Beta"]  # the constraint's first two
    assert result.results["cands"]["items"] == ["Alpha", "Beta", "Gamma"]


def test_treatment_asks_the_llm_with_distinct_items_over_the_members_candidates(
        recommend, models) -> None:
    key = _key_for(recommend, "treatment", genre_known=False)
    result = _run(recommend, key)
    assert result.variant == "treatment"
    assert result.outputs["titles"] == ["Delta"]  # the only comedy title, picked
    assert models.calls == [("llm", None)]
    assert result.results["rank"] is None  # gated off for this variant


def test_a_step_timing_out_takes_its_default(tmp_path: Path, models) -> None:
    steps = [{"name": "slow", "kind": "model", "model": "slow", "inputs": {"features": [[1.0]]},
              "timeout_ms": 50, "fallback": "default", "default": {"probability": [[0.5]]}},
             {"name": "out", "kind": "python", "function": "f.py:f",
              "args": {"p": "$slow.probability"}}]
    (tmp_path / "f.py").write_text("def f(p):\n    return p\n")
    result = asyncio.run(build(tmp_path, models, steps).run({"member_id": "m"}, "r"))
    assert result.results["out"] == [[0.5]]


def test_a_step_timing_out_with_skip_answers_null_and_with_fail_fails(tmp_path: Path,
                                                                     models) -> None:
    slow = {"name": "slow", "kind": "model", "model": "slow", "inputs": {"features": [[1.0]]},
            "timeout_ms": 50}
    skipped = build(tmp_path, models, [{**slow, "fallback": "skip"}])
    assert asyncio.run(skipped.run({"member_id": "m"}, "r")).results["slow"] is None
    failing = build(tmp_path, models, [slow])
    with pytest.raises(RequestTimeout, match="step 'slow' timed out"):
        asyncio.run(failing.run({"member_id": "m"}, "r"))


def test_the_request_deadline_bounds_every_step(tmp_path: Path, models) -> None:
    slow = {"name": "slow", "kind": "model", "model": "slow", "inputs": {"features": [[1.0]]},
            "fallback": "skip"}
    pipeline = build(tmp_path, models, [slow], deadline_ms=50)
    result = asyncio.run(pipeline.run({"member_id": "m"}, "r"))
    assert result.results["slow"] is None


def test_independent_steps_run_concurrently(tmp_path: Path, models) -> None:
    (tmp_path / "f.py").write_text(
        "import asyncio\n_events = {}\n"
        "def _event():\n"
        "    return _events.setdefault(id(asyncio.get_running_loop()), asyncio.Event())\n"
        "async def wait():\n    await asyncio.wait_for(_event().wait(), 5)\n    return 1\n"
        "async def mark():\n    _event().set()\n    return 2\n")
    steps = [{"name": "a", "kind": "python", "function": "f.py:wait"},
             {"name": "b", "kind": "python", "function": "f.py:mark"}]
    pipeline = build(tmp_path, models, steps)
    # `a` finishes only once `b` has run: steps run one after the other would time out in `a`
    assert asyncio.run(pipeline.run({"member_id": "m"}, "r")).results == {"a": 1, "b": 2}


def test_a_bad_key_fails_the_request_naming_the_step(tmp_path: Path, models) -> None:
    steps = [{"name": "arm", "kind": "experiment", "key": "$input.member_id", "salt": "s",
              "variants": [{"name": "a", "weight": 1}]}]
    pipeline = build(tmp_path, models, steps)
    with pytest.raises(InvalidArgument, match="experiment 'arm': the key must be"):
        asyncio.run(pipeline.run({"member_id": None}, "r"))
    assert asyncio.run(pipeline.run({"member_id": "ok"}, "r")).variant == "a"
