"""Session-wide fixtures: the materialized default models and ONE real instance shared by
every real-engine test (booting vLLM costs ~30 s per model on this machine), and one in-process
KServe instance over fake engines shared by the protocol tests.

The tiers (tests/README.md): a test is marked `engine`, `postgres` or `ray` from the fixtures it
uses (`pytest_collection_modifyitems` below), or by a mark of its own where it starts an engine,
a database or a cluster itself; `-m "not engine and not postgres and not ray"` is the fast tier.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.harness import ROOT, RunningInstance, running_instance

if TYPE_CHECKING:
    from tests.support.compiled_embedder import Announced
    from tests.support.engine_count import EngineCounter
    from tests.support.kserve_instance import Instance
    from tests.support.spare import Spare

os.environ.setdefault("PODIUM_HOME", str(ROOT / ".podium"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# an engine booted from a cached admission measurement over an hour old measures again after
# ready when idle: its probe requests would show in the engine counters tests read as deltas
os.environ.setdefault("PODIUM_ADMISSION_REFRESH", "0")
# in-process apps compile constraints in their threads: each test's event loop would start a
# compile worker of its own (seconds of CPU each); `podium serve` subprocesses run with the
# platform's default (a worker), see tests/support/harness.py, and the worker's own tests
# ask for it explicitly
os.environ.setdefault("PODIUM_CONSTRAINT_COMPILER", "thread")
# the suite runs several engines at once on this 2-core machine (the shared instance alone has
# two): each worker keeps vLLM's one OpenMP thread, as before worker_threads' `auto` (which
# assumes an instance with its cores to itself). tests/frontends/test_openai_real.py took
# 278 s with `auto` against 125 s with one thread (docs/benchmarks.md, "Worker threads chosen
# at boot"); the spare instance (tests/support/spare.py) runs `auto`, and
# tests/preload/test_preloaded_real.py reads its team back
os.environ.setdefault("PODIUM_WORKER_THREADS", "1")

LLM = "smollm2-135m-instruct"
EMBEDDER = "all-minilm-l6-v2"
API_KEY = "test-key-0123456789"
MAX_NUM_QUEUED_TOKENS = 1500
"""The shared instance's prefill backlog limit: far above any one test's prompts (16 chats at
once are 700 tokens), low enough for tests/frontends/test_admission_real.py to pass it with
three prompts of 700 tokens (every admitted one is prefilled: its tokens cost CPU time)."""
MAX_NUM_BATCHED_TOKENS = 256
"""The shared instance's prefill chunk (vLLM's budget of tokens a step; its CPU default is
2,048): a prompt just over it is prefilled in two chunks, and on a CPU every prompt token
costs (tests/engine_patches/test_cpu_seed_real.py sends one)."""
CATALOG_SIZE = 5000
"""The shared LLM package's constraint_catalog: the first titles of tests/support/catalog.py,
tokenized by the instance at boot."""
KV_BLOCK_SIZE = 32
"""The shared instance's KV block (vLLM's CPU default is 128): the prefix cache shares whole
blocks only, and with 32 the chat template's system prompt and a test's repeated task are read
from it instead of prefilled again by each of the many similar requests."""

LORA_SLOTS = 4
"""The shared LLM's `lora.max_loras`: adapters one engine step mixes. Below Podium's default
(8) so that test_lora_real fills every slot, the case vLLM's CPU ops got wrong, with 4
adapters (fewer loads and requests on the shared engine); the ops do not depend on the
number of slots (tests/engine_patches/test_lora_linear.py)."""
LORA_CPU_SLOTS = 6
"""The shared LLM's `lora.max_cpu_loras`: adapters kept loaded (an LRU past it)."""


TIER_FIXTURES = {
    "engine": {"instance": "tests.conftest", "openai_client": "tests.conftest",
               "spare_instance": "tests.conftest",
               "constrained_run": "tests.constraints.conftest"},
    "postgres": {"postgres_url": "tests.control.conftest",
                 "fresh_postgres": "tests.control.conftest"},
    "ray": {"ray_cluster": "tests.support.ray_cluster",
            "ray_platform": "tests.control.test_ray_runtime"},
}
"""Fixtures that put a test in a tier, by name and the module defining them: any test using one
(directly or through another fixture) gets the mark, so a new test on the shared instance cannot
slip into the fast tier. The module counts: tests/gateway's own fake `instance` is no engine."""


def _uses(item: pytest.Item, name: str, module: str) -> bool:
    """Whether the test uses (directly or through another fixture) the fixture `name` that
    `module` defines."""
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.get(name) if info is not None else None
    return bool(definitions) and getattr(definitions[-1].func, "__module__", None) == module


def _tier_marks(item: pytest.Item) -> set[str]:
    return {mark for mark, fixtures in TIER_FIXTURES.items()
            for name, module in fixtures.items() if _uses(item, name, module)}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for mark in _tier_marks(item):
            if item.get_closest_marker(mark) is None:
                item.add_marker(mark)
    _run_spare_users_together(items)


def _run_spare_users_together(items: list[pytest.Item]) -> None:
    """The tests on the spare instance run one after the other, where the first of them was:
    it is up from the first until the drain that ends it (last), not beside the engines the
    tests between them start (memory), and it is booted once."""
    users = [item for item in items if "spare_instance" in getattr(item, "fixturenames", ())]
    if len(users) < 2:
        return
    chosen = set(users)
    others = [item for item in items if item not in chosen]
    first = items.index(users[0])  # every item before it is one of the others
    # a module that ends the spare (ENDS_SPARE_INSTANCE) runs after the spare's other users
    users.sort(key=lambda item: bool(getattr(getattr(item, "module", None),
                                             "ENDS_SPARE_INSTANCE", False)))
    items[:] = [*others[:first], *users, *others[first:]]


_engine_counter: EngineCounter | None = None


def pytest_configure(config: pytest.Config) -> None:
    """PODIUM_TEST_ENGINE_LOG=FILE: log every real engine this run starts (engine_count.py)."""
    global _engine_counter
    from tests.support.engine_count import from_environment

    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
        return  # the xdist controller: its workers count (and run the tests)
    _engine_counter = from_environment()
    if _engine_counter is not None:
        _engine_counter.start()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _engine_counter is not None:
        _engine_counter.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if _engine_counter is not None:
        _engine_counter.current = item.nodeid
    return (yield)


@pytest.fixture(scope="session", autouse=True)
def _early_engine_runs(request: pytest.FixtureRequest,
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Engine work in a process of its own that no test waits on at once, started in the
    background at the session's first test when a test of the session reads it, to use the
    CPU the first tests' waits leave (tests/support/background.py): the constraint script's run
    (`constrained_run`, tests/support/constrained_run.py), the engine's metric families
    (`registered`, tests/metrics/test_engine_metrics.py) and the int8 instance's boot
    (`int8_instance`, tests/support/int8_instance.py). Stopped if still running when the
    session ends."""
    from tests.support import background, int8_instance

    items = getattr(request.session, "items", [])
    if any(_uses(item, "int8_instance", "tests.package.test_precision_real") for item in items):
        request.getfixturevalue("default_model_dir")  # materialized
        int8_instance.start(tmp_path_factory.mktemp("int8"))
    if any(_uses(item, "constrained_run", "tests.constraints.conftest") for item in items):
        from tests.support import constrained_run

        constrained_run.start(request.getfixturevalue("default_model_dir"),
                              tmp_path_factory.mktemp("constrained"),
                              tmp_path_factory.mktemp("constraint-cache"))
    if any(_uses(item, "registered", "tests.metrics.test_engine_metrics") for item in items):
        from tests.support import engine_families

        engine_families.start(request.getfixturevalue("model_repository") / LLM,
                              request.getfixturevalue("default_model_dir"),
                              tmp_path_factory.mktemp("families"))
    yield
    background.stop_all()
    int8_instance.stop()


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The default LLM materialized into the cache (HF folder: bf16 safetensors + tokenizer)."""
    from podium.package.defaults import default_model_dir as materialized

    return materialized()


@pytest.fixture(scope="session")
def model_repository(tmp_path_factory: pytest.TempPathFactory,
                     default_model_dir: Path) -> Path:
    """A repository with the default LLM (its scheduling as shipped, chunked prefill and prefix
    caching on, with a smaller chunk and KV block, and a constraint catalog) and the embedding
    model, compiled (tests/support/compiled_embedder.py)."""
    from podium.package.defaults import default_llm_manifest
    from podium.package.package import write_manifest
    from tests.support import compiled_embedder
    from tests.support.catalog import make_titles

    repo = tmp_path_factory.mktemp("repository")
    manifest = default_llm_manifest()
    manifest["engine_args"] = {**manifest["engine_args"],
                               "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
                               "block_size": KV_BLOCK_SIZE}
    manifest["constraint_catalog"] = "catalog.txt"
    # LoRA on (tests/backends/vllm/test_lora_real.py serves adapters on this engine):
    # LORA_SLOTS adapters a batch
    manifest["lora"] = {"max_loras": LORA_SLOTS, "max_cpu_loras": LORA_CPU_SLOTS}
    (repo / LLM).mkdir()
    (repo / LLM / "catalog.txt").write_text("\n".join(make_titles(CATALOG_SIZE)) + "\n")
    write_manifest(repo / LLM, manifest)
    write_manifest(repo / EMBEDDER, compiled_embedder.manifest())
    return repo


@pytest.fixture(scope="session")
def announced_embedder(model_repository: Path,
                       tmp_path_factory: pytest.TempPathFactory) -> Announced:
    """The shared instance's embedder compiled at announce into the session's compile cache,
    before the instance boots from it (tests/package/test_compile_real.py reads both)."""
    from tests.support.compiled_embedder import announce

    return announce(model_repository / EMBEDDER, tmp_path_factory.mktemp("compiled"))


@pytest.fixture(scope="session")
def instance(model_repository: Path, announced_embedder: Announced,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningInstance]:
    """The shared real instance (API key on, /metrics open for scrapers), its embedder booted
    from the session's compile cache."""
    log = tmp_path_factory.mktemp("logs") / "instance.log"
    with running_instance(["--repository", str(model_repository), "--metrics-open",
                           "--max-num-queued-tokens", str(MAX_NUM_QUEUED_TOKENS)], log,
                          api_key=API_KEY,
                          env={"PODIUM_COMPILE_CACHE": str(announced_embedder.cache)}
                          ) as running:
        yield running


@pytest.fixture(scope="session")
def openai_client(instance: RunningInstance):
    import openai

    return openai.OpenAI(base_url=instance.openai_url, api_key=API_KEY, max_retries=0,
                         timeout=120)


@pytest.fixture(scope="session")
def spare_instance(default_model_dir: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spare]:
    """A second real instance of the default LLM, booted on first `get()`, for the tests that
    need two or end one (tests/support/spare.py): one engine start for all of them."""
    from tests.support.spare import Spare

    spare = Spare(tmp_path_factory.mktemp("spare"))
    try:
        yield spare
    finally:
        spare.stop()


@pytest.fixture(scope="session")
def examples_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example repository (classic backends), written once."""
    from podium.examples import create_examples

    target = tmp_path_factory.mktemp("repository")
    create_examples(target)
    return target


@pytest.fixture(scope="session")
def classic_examples_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example repository without its LLM (nor the pipeline calling it): a `podium serve`
    of it starts no vLLM engine
    (the examples' LLM is the real default model: serving `examples_dir` boots it)."""
    import shutil

    from podium.examples import create_examples

    target = tmp_path_factory.mktemp("classic-repository")
    create_examples(target)
    shutil.rmtree(target / LLM)
    shutil.rmtree(target / "recommend")  # its treatment calls the LLM
    return target


@pytest.fixture(scope="session")
def kserve_instance(examples_dir: Path,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[Instance]:
    """KServe HTTP + gRPC on loopback over the examples and fake-engine LLMs (no vLLM)."""
    from tests.support.kserve_instance import serving

    with serving(examples_dir, tmp_path_factory) as served:
        yield served
