"""Time from 16 client disconnects to an idle engine, Podium vs `vllm serve`, same model.

    python -m bench.cancellation [--rounds 3] [--clients 16]
        [--servers podium podium-gateway vllm]

Each round: `--clients` chat completions of 4,000 tokens (`ignore_eos`; half streamed and left
after the first event, half waiting for the whole answer), started together; once the
engine holds all of them (`vllm:num_requests_running` + `vllm:num_requests_waiting` in
`/metrics`), every client drops its connection; the figure is the time until both gauges are 0
(polled every 20 ms). `podium-gateway` sends the clients through an in-process gateway in front
of the Podium instance. The servers run one at a time (they would share the cores). Prints
one JSON line per round and the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path

from tests.support.vanishing import openai_client, vanish

from bench.harness import free_port, median
from bench.openai_overhead import ENGINE_ARGS, MODEL, resolved_precision, server


def measure(kind: str, port: int, rounds: int, num_clients: int) -> list[float]:
    """Seconds to idle after each round's disconnects."""
    client_url = f"http://127.0.0.1:{port}"
    front = None
    if kind == "podium-gateway":
        from tests.support.servers import Served

        from podium.gateway.proxy import Gateway
        from podium.routes.table import Endpoint

        gateway = Gateway(max_attempts=1)
        gateway.table.add_endpoint(MODEL, "1", Endpoint("llm-1", client_url))
        gateway.table.set_split(MODEL, {"1": 100})
        front = Served(gateway.app())
    try:
        results = []
        url = front.url if front is not None else client_url
        for round_ in range(rounds):
            seconds = asyncio.run(vanish(
                client_url, MODEL, lambda i, streams: openai_client(url, MODEL, i, streams),
                num_clients))
            print(json.dumps({"server": kind, "round": round_ + 1, "clients": num_clients,
                              "seconds_to_idle": round(seconds, 3)}), flush=True)
            results.append(seconds)
        return results
    finally:
        if front is not None:
            front.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--servers", nargs="+", default=["podium", "podium-gateway", "vllm"],
                        choices=["podium", "podium-gateway", "vllm"])
    args = parser.parse_args()
    from podium.package.defaults import default_model_dir

    model_dir = default_model_dir()
    medians: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PODIUM_HOME": os.environ.get("PODIUM_HOME", str(Path(tmp))),
               "HF_HUB_OFFLINE": "1"}
        for kind in dict.fromkeys("vllm" if s == "vllm" else "podium" for s in args.servers):
            port = free_port()
            with server(kind, model_dir, port, env, Path(tmp) / f"{kind}.log") as served:
                print(json.dumps({"server": kind, "boot_s": round(served.boot_s, 1),
                                  "engine_args": ENGINE_ARGS,
                                  "precision": resolved_precision(model_dir)}), flush=True)
                for name in args.servers:
                    if (name == "vllm") == (kind == "vllm"):
                        medians[name] = median(measure(name, port, args.rounds, args.clients))
    print("\nserver            median seconds from disconnects to an idle engine")
    for name, seconds in medians.items():
        print(f"{name:<17} {seconds:6.3f}")


if __name__ == "__main__":
    main()
