"""A local Ray head for a test module (2 CPUs, no dashboard, loopback), and what the Ray
runtime tests send and deploy on it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from podium.control.rollout_config import RolloutConfig

# instances ask for half a CPU so v1 and v2 fit side by side on the 2-CPU head
INSTANCE_CPUS = 0.5
BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [2.0]}]}
FIRST = RolloutConfig(stages=(100,), num_instances=1, ready_timeout_ms=60_000,
                      analysis_window_ms=0, warm_delay_ms=0)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """A local Ray head for this module; instances bind loopback like every test server."""
    with pytest.MonkeyPatch.context() as mp:
        # Ray otherwise resolves its node IP to the machine's network address; this keeps the
        # head, its workers and so the instances on 127.0.0.1
        mp.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        import ray

        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 1024 * 1024,
                 log_to_driver=False)
        yield ray
        ray.shutdown()
