"""The default LLM under a real `podium up`: its package as a given version, its instances."""

from __future__ import annotations

from pathlib import Path

from podium.package.defaults import DEFAULT_MODEL, default_llm_manifest
from podium.package.package import write_manifest
from tests.support.up_process import Up


def write_llm(root: Path, version: str) -> Path:
    """The default LLM's package as `version` (same weights, so the cache entry is shared).

    KV blocks of 32 tokens, not vLLM's CPU default of 128: a client repeating its prompt then
    reads all but its last few tokens from the prefix cache, so the load that runs while an
    instance boots costs less of the CPU the boot needs (tests/conftest.py: KV_BLOCK_SIZE)."""
    manifest = default_llm_manifest()
    manifest["version"] = version
    manifest["engine_args"] = {**manifest["engine_args"], "max_model_len": 2048,
                               "block_size": 32}
    # explicit admission bounds (vLLM's own defaults before Podium measured them): these
    # scenarios judge rollouts and autoscaling under a client load while a second engine boots
    # on the same 2 cores, where the bound measured for `max_num_seqs` 2 sheds part of that load
    # with 429s; shedding by the measured bound is tested on its own
    # (tests/frontends/test_admission_real.py)
    manifest["max_num_queued_reqs"] = 256
    manifest["max_num_queued_tokens"] = 65_536
    return write_manifest(root / f"{DEFAULT_MODEL}-{version}", manifest).root


def instances(up: Up, version: str, state: str | None = "ready") -> list[dict]:
    """The instances of the default LLM's `version` in `state` (any state: None)."""
    versions = up.status()["models"].get(DEFAULT_MODEL, {}).get("versions", {})
    return [i for i in versions.get(version, {}).get("instances", [])
            if state is None or i["state"] == state]
