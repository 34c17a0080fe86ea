"""Overload of a classic model through the gateway: `xgb-example` behind one gateway process,
offered 4x its measured capacity, with the gateway's default in-flight bound and with a bound
sized to the capacity, one after the other in one run.

    .venv/bin/python bench/overload_xgb.py [--seconds 60] [--factor 4] [--concurrency 16]
                                           [--bounds 256,32] [--max-queue 1024]
                                           [--client raw|httpx] [--client-processes 2]

The phases are `bench/overload.py`'s (capacity with a closed loop of `--concurrency` clients,
then Poisson arrivals at `--factor` x capacity for `--seconds`, then back at capacity for the
recovery), the request a KServe v2 JSON infer of one row; the time measured is the whole answer
(there is no first token). Each bound gets a fresh instance (`podium serve`, its batcher queue
`--max-queue`) and a fresh gateway process whose `--max-in-flight-per-instance` is the bound,
so one setting's backlog cannot leak into the next. The load generator shares the machine's
cores with both servers; its own cost lowers the capacity it measures, for every bound alike.
By default it is `rawload`'s (pre-encoded requests over keep-alive connections from
`--client-processes` processes, arrivals on absolute times), light enough to offer the spike it
is asked for; `--client httpx` is the client of the first run (~1 ms of CPU per request).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from gateway_llm import child  # noqa: E402
from gateway_overhead import FEATURES, free_port  # noqa: E402
from overload import Answer, Call, add_phase_args, measure  # noqa: E402
from rawload import Target, closed_loop, open_loop  # noqa: E402

MODEL = "xgb-example"


BODY = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 20],
                    "data": FEATURES[0]}]}


def raw_loops(url: str, processes: int, lags: list[float]):  # type: ignore[no-untyped-def]
    """`measure`'s loops with rawload's client; each open loop's lag goes to `lags`."""
    target = Target.post_json(f"{url}/v2/models/{MODEL}/infer", json.dumps(BODY).encode())

    def answers(raw: list[tuple[float, int, float]]) -> list[Answer]:
        return [Answer(sent, status, seconds, status == 200) for sent, status, seconds in raw]

    def closed(n: int, seconds: float) -> list[Answer]:
        return answers(closed_loop(target, n, seconds, processes=processes))

    def opened(phases: list[tuple[float, float]]) -> list[Answer]:
        raw, lag = open_loop(target, phases, processes=processes)
        lags.append(lag)
        return answers(raw)

    return closed, opened


def infer(url: str) -> Call:
    """One KServe v2 infer through the gateway: status, time to the whole answer."""
    body = BODY

    async def call(client: httpx.AsyncClient) -> Answer:
        sent = time.monotonic()
        try:
            r = await client.post(f"{url}/v2/models/{MODEL}/infer", json=body)
        except httpx.HTTPError:
            return Answer(sent, 599, time.monotonic() - sent, False)
        return Answer(sent, r.status_code, time.monotonic() - sent, r.status_code == 200)

    return call


def run_gateway(http_port: int, upstream: str, bound: int) -> None:
    """Child mode: a gateway process with one static endpoint and the given in-flight bound."""
    import uvicorn

    from podium.gateway.limits import GatewayLimits
    from podium.gateway.proxy import Gateway
    from podium.gateway.routing import Endpoint

    gateway = Gateway(limits=GatewayLimits(max_in_flight_per_instance=bound))
    gateway.table.add_endpoint(MODEL, "1", Endpoint("xgb-1", upstream))
    gateway.table.set_split(MODEL, {"1": 100})
    from podium.gateway.process import KEEP_ALIVE_S

    # the keep-alive of `podium gateway` (uvicorn's default closes idle connections after 5 s)
    uvicorn.run(gateway.app(), host="127.0.0.1", port=http_port, log_level="warning",
                access_log=False, timeout_keep_alive=KEEP_ALIVE_S)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_phase_args(parser)
    parser.add_argument("--bounds", default="256,32",
                        help="the gateway's per-instance in-flight bounds to compare")
    parser.add_argument("--max-queue", type=int, default=1024, help="the batcher's queue")
    parser.add_argument("--client", choices=["raw", "httpx"], default="raw")
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--gateway-child", nargs=3, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.gateway_child:
        port, upstream, bound = opts.gateway_child
        run_gateway(int(port), upstream, int(bound))
        return 0

    from podium.examples.builders import write_xgb_example

    package = write_xgb_example(Path(tempfile.mkdtemp()) / MODEL)
    logs = Path(tempfile.mkdtemp(prefix="podium-overload-xgb-"))
    print(f"{MODEL} through the gateway: spike {opts.factor}x capacity for {opts.seconds}s, "
          f"batcher max_queue {opts.max_queue}; logs in {logs}", flush=True)
    results: dict[str, dict[str, Any]] = {}
    for bound in opts.bounds.split(","):
        inst, gw = free_port(), free_port()
        instance = [sys.executable, "-m", "podium.cli", "serve", str(package), "--host",
                    "127.0.0.1", "--http-port", str(inst), "--grpc-port", "-1",
                    "--max-queue", str(opts.max_queue)]
        gateway = [sys.executable, __file__, "--gateway-child", str(gw),
                   f"http://127.0.0.1:{inst}", bound]
        env = dict(os.environ)
        with child(instance, f"http://127.0.0.1:{inst}/health/ready", logs / f"i{bound}.log",
                   env), \
                child(gateway, f"http://127.0.0.1:{gw}/health/ready", logs / f"g{bound}.log",
                      env):
            url = f"http://127.0.0.1:{gw}"
            lags: list[float] = []
            if opts.client == "raw":
                results[bound] = measure(None, opts, raw_loops(url, opts.client_processes, lags))
                results[bound]["client_lag_s"] = round(max(lags), 3)
            else:
                results[bound] = measure(infer(url), opts)
            results[bound]["offered_rps"] = round(results[bound]["offered"] / opts.seconds, 1)
        print(json.dumps({"bound": int(bound), **results[bound]}), flush=True)
    keys = ["capacity_rps", "offered_rps", "share_2xx", "capacity_p99_ttft_s",
            "admitted_p99_ttft_s", "reject_median_ms", "reject_p99_ms", "num_5xx", "recovery_s"]
    print(f"\n{'bound':<8}" + "".join(f"{k:>22}" for k in keys))
    for bound, r in results.items():
        print(f"{bound:<8}" + "".join(f"{r[k]!s:>22}" for k in keys))
    print("(for xgb the *_ttft_s columns are the time to the whole answer)")
    for bound, r in results.items():
        print(f"bound {bound}: admitted p99 / capacity p99 "
              f"{r['admitted_p99_ttft_s'] / r['capacity_p99_ttft_s']:.2f}x (target <= 2x), "
              f"rejections p99 {r['reject_p99_ms']} ms (<= 50), 5xx {r['num_5xx']} (0), "
              f"recovery {r['recovery_s']} s (<= 5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
