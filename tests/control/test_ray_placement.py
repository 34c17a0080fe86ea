"""Where the Ray runtime may put an instance, without a cluster: a package's `resources` as
Ray's request, why a request fits no node, and the names adoption finds actors by."""

from __future__ import annotations

from pathlib import Path

import pytest

from podium.control.models import PackageRow
from podium.control.runtime.ray_placement import (
    MIB,
    Resources,
    actor_name,
    instance_of,
    namespace_for,
    resources_for,
    unplaceable,
)
from tests.support.control_api import Env, package_dir


def _package(backend: str = "python", resources: dict | None = None,
             **engine_args: object) -> PackageRow:
    manifest: dict = {"backend": backend, "engine_args": engine_args}
    if resources is not None:
        manifest["resources"] = resources
    return PackageRow(name="m", version="1", backend=backend, location="/p", manifest=manifest)


@pytest.mark.parametrize(("package", "wanted"), [
    (_package(resources={}), Resources(0.5, 0.0)),
    (_package(resources={"cpus": 2, "memory_mib": 512}), Resources(2.0, 0.0, 512 * MIB)),
    (_package(resources={"gpus": 0.25}), Resources(0.5, 0.25)),
    (_package("vllm", tensor_parallel_size=2), Resources(0.5, 2.0)),
    (_package("vllm", {"gpus": 1}, tensor_parallel_size=2), Resources(0.5, 1.0)),
    (_package(resources={"custom": {"region-eu": 0.001, "accelerator_type:A10G": 1}}),
     Resources(0.5, 0.0, None, (("accelerator_type:A10G", 1.0), ("region-eu", 0.001)))),
], ids=["defaults-from-the-runtime", "cpus-and-memory", "a-share-of-a-gpu",
        "vllm-one-gpu-per-rank", "declared-gpus-win-over-ranks", "custom-resources"])
def test_a_packages_resources_become_its_actors_request(package: PackageRow,
                                                        wanted: Resources) -> None:
    assert resources_for(package, cluster_gpus=4.0, num_cpus=0.5) == wanted


def test_the_request_as_ray_actor_options() -> None:
    wanted = resources_for(_package(resources={"cpus": 1, "memory_mib": 1,
                                               "custom": {"region-eu": 0.5}}), 0.0)
    assert wanted.actor_options() == {"num_cpus": 1.0, "num_gpus": 0.0, "memory": MIB,
                                      "resources": {"region-eu": 0.5}}
    assert Resources(1.0, 0.0).actor_options() == {"num_cpus": 1.0, "num_gpus": 0.0}


NODES = [
    {"Alive": True, "Resources": {"CPU": 2.0, "memory": 4.0 * 1024 * MIB, "region-eu": 1.0}},
    {"Alive": True, "Resources": {"CPU": 4.0, "GPU": 1.0, "memory": 8.0 * 1024 * MIB}},
    {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0, "region-us": 1.0}},
]


@pytest.mark.parametrize(("wanted", "why"), [
    (Resources(2.0, 0.0, None, (("region-eu", 0.1),)), None),
    (Resources(4.0, 1.0), None),
    (Resources(8.0, 0.0), "no live node offers CPUs (resources.cpus, else --ray-cpus)=8 "
                          "(largest node: 4)"),
    (Resources(1.0, 0.0, None, (("region-us", 0.1),)),
     "no live node offers resources.custom.region-us=0.1 (largest node: 0)"),
    (Resources(1.0, 0.0, 16 * 1024 * MIB), "no live node offers resources.memory_mib=16384 "
                                           "(largest node: 8192)"),
    (Resources(1.0, 1.0, None, (("region-eu", 0.1),)),
     "no single node offers all of CPUs (resources.cpus, else --ray-cpus), resources.gpus, "
     "resources.custom.region-eu together"),
], ids=["fits-the-eu-node", "fits-the-gpu-node", "more-cpus-than-any-node",
        "a-resource-only-a-dead-node-had", "more-memory-than-any-node", "parts-on-different-nodes"])
def test_a_request_no_live_node_can_hold_says_which_field(wanted: Resources,
                                                          why: str | None) -> None:
    assert unplaceable(wanted, NODES) == why


def test_an_empty_cluster_holds_nothing() -> None:
    assert unplaceable(Resources(1.0, 0.0), []) == "the Ray cluster has no live node"


def test_actor_names_map_back_to_their_instance_and_start() -> None:
    for instance_id, restarts in (("echo-1-3", 0), ("llm-1.2.0-rc1-17", 4)):
        assert instance_of(actor_name(instance_id, restarts)) == (instance_id, restarts)
    assert instance_of("somebody-elses-actor") is None
    assert instance_of("echo-1-3#x") is None


def test_one_namespace_per_database() -> None:
    first = namespace_for("sqlite:////home/a/control.db")
    assert first == namespace_for("sqlite:////home/a/control.db")
    assert first != namespace_for("sqlite:////home/b/control.db")
    assert first.startswith("podium-")


@pytest.mark.parametrize(("resources", "field", "fix"), [
    ({"cpus": 0}, "resources.cpus", "greater than 0"),
    ({"gpus": 1.5}, "resources.gpus", "use 1 or 2"),
    ({"memory_mib": 0}, "resources.memory_mib", "greater than or equal to 1"),
    ({"custom": {"CPU": 1}}, "resources.custom", "use resources.cpus"),
    ({"custom": {"region eu": 1}}, "resources.custom", "e.g. region-eu"),
    ({"custom": {"region-eu": 0}}, "resources.custom", "e.g. 0.001"),
    ({"custom": {"region-eu": 0.00001}}, "resources.custom", "use at least 0.0001"),
    ({"cpu": 1}, "resources.cpu", "not a known field"),
], ids=["zero-cpus", "fractional-gpus-above-one", "zero-memory", "cpu-as-custom",
        "space-in-a-name", "zero-amount", "finer-than-ray-counts", "misspelt-field"])
def test_announcing_bad_resources_is_400_naming_the_field_and_the_fix(
        env: Env, tmp_path: Path, resources: dict, field: str, fix: str) -> None:
    bad = env.client.post("/v1/packages", json={
        "path": package_dir(tmp_path, "iris", "1", resources=resources)})
    assert bad.status_code == 400, bad.text
    error = bad.json()["error"]
    assert error["param"] == field and fix in error["message"], error
    assert env.store.list_packages() == []
    good = env.client.post("/v1/packages", json={"path": package_dir(
        tmp_path, "iris", "2", resources={"cpus": 0.5, "custom": {"region-eu": 0.001}})})
    assert good.status_code == 201, good.text
    [stored] = env.store.list_packages()
    assert resources_for(PackageRow(name="iris", version="2", backend="python", location="",
                                    manifest=stored.manifest), 0.0) == Resources(
        0.5, 0.0, None, (("region-eu", 0.001),))
