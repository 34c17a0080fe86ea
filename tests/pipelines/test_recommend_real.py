"""The `recommend` example end to end on the real LLM and xgb-example, over tritonclient HTTP
and gRPC. The pipeline and xgb-example are served by a `podium serve` of their own (no engine);
the LLM is the shared session instance's, reached through the pipeline's `gateway_url` (the
remote path, with the key in PODIUM_PIPELINE_GATEWAY_KEY): no engine is started for this."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from podium.examples.builders import write_xgb_example
from podium.examples.recommend import recommend_manifest, write_recommend_example
from podium.package.package import write_manifest
from podium.pipelines.steps.experiment import ExperimentStep
from tests.conftest import API_KEY, LLM
from tests.support.harness import RunningInstance, running_instance


@pytest.fixture(scope="module")
def pipeline(instance: RunningInstance, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[RunningInstance, Path]]:
    repository = tmp_path_factory.mktemp("recommend-real")
    write_xgb_example(repository / "xgb-example")
    write_recommend_example(repository / "recommend", LLM)
    manifest = recommend_manifest(LLM)
    manifest["gateway_url"] = instance.http_url
    write_manifest(repository / "recommend", manifest)
    log = tmp_path_factory.mktemp("logs") / "recommend.log"
    with running_instance(["--repository", str(repository)], log,
                          env={"PODIUM_PIPELINE_GATEWAY_KEY": API_KEY}) as served:
        yield served, repository


def _member(variant: str) -> str:
    experiment = ExperimentStep.model_validate(recommend_manifest(LLM)["steps"][0])
    return next(f"m{i}" for i in range(200) if experiment.allocate(f"m{i}").name == variant)


def _candidates(repository: Path, member: str) -> list[str]:
    import sqlite3

    with sqlite3.connect(repository / "recommend" / "catalog.db") as db:
        genre = db.execute("SELECT genre FROM members WHERE member_id = ?", (member,)
                           ).fetchone()[0]
        return [r[0] for r in db.execute("SELECT title FROM titles WHERE genre = ?", (genre,))]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_treatment_has_the_llm_pick_three_distinct_titles_of_the_members_candidates(
        pipeline, protocol: str) -> None:
    served, repository = pipeline
    member = _member("treatment")
    result = _infer(served, protocol, member)
    titles = [t.decode() for t in result.as_numpy("titles")]
    assert result.as_numpy("variant")[0] == b"treatment"
    assert result.as_numpy("ranked_by")[0] == b"llm"
    assert len(titles) == 3 == len(set(titles))
    assert set(titles) <= set(_candidates(repository, member))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_control_has_xgb_example_rank_the_candidates(pipeline, protocol: str) -> None:
    served, repository = pipeline
    member = _member("control")
    result = _infer(served, protocol, member)
    assert result.as_numpy("variant")[0] == b"control"
    assert result.as_numpy("ranked_by")[0] == b"xgb-example"
    titles = [t.decode() for t in result.as_numpy("titles")]
    assert len(titles) == 3 and set(titles) <= set(_candidates(repository, member))


def _infer(served: RunningInstance, protocol: str, member: str):
    if protocol == "http":
        import tritonclient.http as client_module

        client = client_module.InferenceServerClient(served.http_url.removeprefix("http://"),
                                                     network_timeout=120)
    else:
        import tritonclient.grpc as client_module

        client = client_module.InferenceServerClient(served.grpc_url)
    tensor = client_module.InferInput("member_id", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([member.encode()], dtype=object))
    return client.infer("recommend", [tensor])
