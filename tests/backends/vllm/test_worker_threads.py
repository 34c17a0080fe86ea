"""The engine worker's OpenMP threads: chosen at boot from the instance's cores (auto), or by
the package's `worker_threads`, or PODIUM_WORKER_THREADS, or an explicit
VLLM_CPU_OMP_THREADS_BIND; put in the environment only while the engine starts."""

from __future__ import annotations

import logging
import os

import pytest
from pydantic import ValidationError

from podium.backends.vllm import worker_threads as wt
from podium.errors import BootError
from podium.package.manifest import VllmManifest


def alone(cpu: int) -> frozenset[int]:
    return frozenset({cpu})


def smt(cpu: int) -> frozenset[int]:
    """CPUs n and n+4 are one physical core (a 4-core, 8-thread machine)."""
    return frozenset({cpu % 4, cpu % 4 + 4})


@pytest.mark.parametrize(("cpus", "siblings", "bind", "threads"), [
    ([0, 1], alone, "0,1", 2),
    ([2, 3], alone, "2,3", 2),
    ([0, 4], smt, None, None),  # one physical core: vLLM's binding, as before
    ([1, 5, 2, 6], smt, "1,2", 2),
    ([0], alone, None, None),
    ([0, 1, 2, 3], alone, None, None),  # more cores than measured: vLLM reserves one
], ids=["two-cores", "two-other-cores", "one-core-two-siblings", "two-cores-with-siblings",
        "one-core", "four-cores"])
def test_auto_binds_every_core_of_a_two_core_instance(cpus: list[int], siblings,
                                                     bind: str | None,
                                                     threads: int | None) -> None:
    chosen = wt.choose("auto", {}, cpus, siblings)
    assert (chosen.bind, chosen.threads) == (bind, threads)
    assert chosen.reason.startswith("auto")


def test_the_package_overrides_auto() -> None:
    chosen = wt.choose(3, {}, [0, 1, 2, 3], alone)
    assert (chosen.bind, chosen.threads) == ("0,1,2", 3)
    assert "the package's worker_threads=3" in chosen.reason
    capped = wt.choose(8, {}, [0, 1], alone)
    assert (capped.bind, capped.threads) == ("0,1", 2) and "capped" in capped.reason


def test_one_thread_on_two_cores_leaves_vllms_binding_as_it_was() -> None:
    chosen = wt.choose(1, {}, [0, 1], alone)
    assert (chosen.bind, chosen.threads) == (None, None)
    assert "worker_threads=1" in chosen.reason


def test_the_operators_count_overrides_the_package() -> None:
    chosen = wt.choose(2, {"PODIUM_WORKER_THREADS": "1"}, [0, 1], alone)
    assert chosen.bind is None and "PODIUM_WORKER_THREADS=1" in chosen.reason
    chosen = wt.choose(1, {"PODIUM_WORKER_THREADS": "auto"}, [0, 1], alone)
    assert chosen.bind == "0,1"


def test_an_explicit_binding_wins_over_everything() -> None:
    chosen = wt.choose(2, {"VLLM_CPU_OMP_THREADS_BIND": "1",
                           "PODIUM_WORKER_THREADS": "2"}, [0, 1], alone)
    assert (chosen.bind, chosen.threads) == (None, None)
    assert "VLLM_CPU_OMP_THREADS_BIND='1'" in chosen.reason


@pytest.mark.parametrize("raw", ["0", "two", "-1"])
def test_a_bad_operator_count_stops_boot_naming_the_variable(
        raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setenv("PODIUM_WORKER_THREADS", raw)
    with pytest.raises(BootError, match="PODIUM_WORKER_THREADS"):
        wt.resolve("auto", "smol@1")
    monkeypatch.setenv("PODIUM_WORKER_THREADS", "1")
    assert wt.resolve("auto", "smol@1").bind is None


def test_the_choice_is_logged(monkeypatch: pytest.MonkeyPatch,
                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.delenv("PODIUM_WORKER_THREADS", raising=False)
    with caplog.at_level(logging.INFO, logger="podium.backends.vllm"):
        chosen = wt.resolve("auto", "smol@1")
    assert chosen.describe("smol@1") in caplog.text
    assert caplog.text.count("engine worker of smol@1:") == 1


def test_the_binding_is_in_the_environment_only_while_the_engine_starts() -> None:
    environ: dict[str, str] = {"OTHER": "x"}
    chosen = wt.WorkerThreads(2, "0,1", "auto")
    with wt.environment(chosen, environ):
        assert environ["VLLM_CPU_OMP_THREADS_BIND"] == "0,1"
    assert environ == {"OTHER": "x"}
    with wt.environment(wt.WorkerThreads(None, None, "vLLM's"), environ):
        assert "VLLM_CPU_OMP_THREADS_BIND" not in environ


def test_sysfs_siblings_of_this_machine_include_the_cpu() -> None:
    for cpu in os.sched_getaffinity(0):
        assert cpu in wt.core_siblings(cpu)
    assert wt.core_siblings(10**6) == frozenset({10**6})  # no such CPU: itself


def _manifest(**fields) -> dict:
    return {"name": "smol", "version": "1", "backend": "vllm",
            "weights": {"source": "path", "path": "/m"}, **fields}


def test_the_manifest_takes_auto_or_a_count_and_refuses_the_rest() -> None:
    assert VllmManifest.model_validate(_manifest()).worker_threads == "auto"
    assert VllmManifest.model_validate(_manifest(worker_threads=2)).worker_threads == 2
    for bad in (0, "many", 1.5):
        with pytest.raises(ValidationError, match="worker_threads"):
            VllmManifest.model_validate(_manifest(worker_threads=bad))
