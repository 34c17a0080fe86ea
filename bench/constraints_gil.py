"""Why the compile worker: a constraint compile in a server thread vs in the worker process,
alone and beside one busy Python thread (what a serving event loop is to the GIL).

    HF_HUB_OFFLINE=1 python -m bench.constraints_gil [--samples 100]

Per case, p50 / p90 / p99 of the time a compile waited (`ConstraintPrecompiler.compile` from an
asyncio loop, the server's path), for `distinct_items` specs of 100 and 500 titles drawn from a
50,000-title catalog (the tokenization memo warm), one at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from tests.support.catalog import make_titles

from bench.harness import percentile


async def _worker_compile(worker: Any, spec_json: str) -> dict:
    """One spec through the worker process's message API (`CompileProcess.send`), awaited."""
    done: asyncio.Future[dict] = asyncio.get_running_loop().create_future()

    def answered(message: Any) -> None:
        if done.done():
            return
        if isinstance(message, Exception):
            done.set_exception(message)
        else:
            done.set_result(message)

    worker.send(spec_json.encode(), answered)
    return await done


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=100)
    opts = ap.parse_args()
    from podium.constraints import ConstraintPrecompiler, validate_constraint
    from podium.constraints.compile.store import FormStore
    from podium.package.defaults import default_model_dir

    rng = random.Random(0)
    catalog = make_titles(50_000)
    model = str(default_model_dir())

    def spec(n: int) -> dict:
        return validate_constraint({"type": "distinct_items", "items": rng.sample(catalog, n),
                                    "min": 3, "max": 5})

    def store() -> FormStore:
        return FormStore(Path(tempfile.mkdtemp(prefix="podium-gil-", dir="/dev/shm")))

    async def run() -> None:
        compilers = {"thread": ConstraintPrecompiler(model, 49152, store=store(), process=False),
                     "process": ConstraintPrecompiler(model, 49152, store=store(), process=True)}
        for c in compilers.values():
            await c.compile(spec(20))
            c.load_tokenizer()[0].encode_runs(catalog, quoted=True)  # the memo warm
        while not compilers["process"]._worker.ready():
            await asyncio.sleep(0.05)
        worker = compilers["process"]._worker
        whole = json.dumps(validate_constraint({"type": "distinct_items", "items": catalog,
                                                "min": 3, "max": 5}), sort_keys=True)
        await _worker_compile(worker, whole)  # its memo warm too
        stop = threading.Event()

        def busy() -> None:
            x = 0
            while not stop.is_set():
                for i in range(1000):
                    x += i

        for load in ("idle", "busy thread"):
            if load == "busy thread":
                threading.Thread(target=busy, daemon=True).start()
            for n in (100, 500):
                for where, c in compilers.items():
                    waits = []
                    for _ in range(opts.samples):
                        waits.append((await c.compile(spec(n))).seconds * 1000)
                    p50, p90, p99 = (percentile(waits, q) for q in (50, 90, 99))
                    print(f"{load:>11}, {n} candidates, {where:>7}: p50 {p50:6.2f}  "
                          f"p90 {p90:6.2f}  p99 {p99:6.2f} ms", flush=True)
        stop.set()
        for c in compilers.values():
            c.shutdown()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
