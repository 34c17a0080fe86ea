"""vLLM's admission control is always on, with the limits Podium sets per package: the
`podium serve` flag wins, else the package's manifest, else Podium's default; the engine's
own argument for it is refused in engine_args (one place to set it)."""

from __future__ import annotations

from typing import Any

import pytest

from podium.backends.limits import InstanceLimits
from podium.errors import PackageError
from podium.package.manifest import parse_manifest

BASE = {"name": "llm", "backend": "vllm",
        "weights": {"source": "path", "path": "/nonexistent/model"}}


def _args(limits: InstanceLimits | None = None, **manifest: Any) -> Any:
    from podium.backends.vllm import build_engine_args

    return build_engine_args(parse_manifest({**BASE, **manifest}), "/weights", limits)


@pytest.mark.parametrize(("limits", "manifest", "reqs", "tokens"), [
    pytest.param(None, {}, 256, 65536, id="defaults"),
    pytest.param(None, {"max_num_queued_reqs": 8, "max_num_queued_tokens": 4096}, 8, 4096,
                 id="package"),
    pytest.param(InstanceLimits(max_num_queued_reqs=32), {"max_num_queued_reqs": 8}, 32, 65536,
                 id="flag-over-package"),
    pytest.param(InstanceLimits(max_num_queued_tokens=100), {}, 256, 100, id="flag"),
])
def test_the_engine_gets_the_limit_in_force(limits: InstanceLimits | None,
                                            manifest: dict[str, Any], reqs: int,
                                            tokens: int) -> None:
    args = _args(limits, **manifest)
    assert (args.max_num_queued_reqs, args.max_num_queued_tokens) == (reqs, tokens)


@pytest.mark.parametrize("key", ["max_num_queued_reqs", "max-num-queued-tokens"])
def test_engine_args_cannot_set_admission_limits(key: str) -> None:
    with pytest.raises(PackageError, match="move it to the manifest's top-level"):
        parse_manifest({**BASE, "engine_args": {key: 4}})


def test_limits_out_of_range_name_the_field() -> None:
    with pytest.raises(PackageError, match="max_num_queued_reqs"):
        parse_manifest({**BASE, "max_num_queued_reqs": 0})


def test_the_admission_flags_of_podium_serve_reach_every_backend(monkeypatch) -> None:
    from podium.cli import build_parser
    from podium.errors import InvalidArgument
    from podium.server import serve
    from podium.server.instance import Instance

    configs: list[Any] = []
    monkeypatch.setattr(serve, "run_server", lambda config: configs.append(config) or 0)

    def serve_with(*flags: str) -> Any:
        args = build_parser().parse_args(["serve", "--repository", "/nowhere", *flags])
        return args.func(args)

    serve_with("--max-queue", "7", "--queue-timeout-ms", "250", "--max-num-queued-reqs", "9",
               "--max-num-queued-tokens", "1000", "--max-n", "3",
               "--admission-target-wait-s", "12.5")
    limits = Instance(configs[0]).repository.limits
    assert limits == InstanceLimits(max_queue=7, queue_timeout_ms=250, max_num_queued_reqs=9,
                                    max_num_queued_tokens=1000, max_n=3,
                                    admission_target_wait_s=12.5)
    serve_with()
    assert Instance(configs[1]).repository.limits == InstanceLimits()  # the packages decide
    with pytest.raises(InvalidArgument, match="--max-queue 0"):
        serve_with("--max-queue", "0")
    with pytest.raises(InvalidArgument, match=r"--admission-target-wait-s 0\.5"):
        serve_with("--admission-target-wait-s", "0.5")
    serve_with("--admission-target-wait-s", "60")  # followed by a good one
    assert Instance(configs[-1]).repository.limits.admission_target_wait_s == 60
