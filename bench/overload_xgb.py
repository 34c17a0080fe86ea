"""Overload of a classic model through the gateway: `xgb-example` behind one gateway process,
offered 4x its measured capacity, at each in-flight bound given, one after the other in one run.

    python -m bench.overload_xgb [--seconds 60] [--factor 4] [--concurrency 16]
                                 [--bounds measured,16] [--shed early,full]
                                 [--max-queue 1024] [--server-cpus 0]
                                 [--client raw|httpx] [--client-processes 2]
                                 [--client-connections 256] [--gateway-loop asyncio,uvloop]
                                 [--gateway-heap frozen,unfrozen]

The phases are `bench.overload`'s (capacity with a closed loop of `--concurrency` clients,
then Poisson arrivals at `--factor` x capacity for `--seconds`, then back at capacity for the
recovery), the request a KServe v2 JSON infer of one row; the time measured is the whole answer
(there is no first token). Each bound gets a fresh instance (`podium serve`, its batcher queue
`--max-queue`) and a fresh gateway process whose `--max-in-flight-per-instance` is the bound,
so one setting's backlog cannot leak into the next. `measured` is the default: the gateway's
own bound (256) above the one the instance measures for itself (its completions per busy
second x `--classic-target-wait-s`, `backends.classic_admission`), which the gateway learns
from its answers and keeps, since it is the smaller; a number is a bound set by hand (the
instance's measured bound applies too where it is smaller, which it never is at 16, its
floor). Each row reports the instance's bound and busy rate as min/median/max of what its
`/config` said every half second of the run. The gateway serves HTTP with `podium
gateway`'s protocol; `--shed` lists the refusal paths to compare, each bound run once per
entry in the order given: `early` (a certain shed answered from the request's head,
`gateway.early_shed`, as `podium gateway` does) and `full` (every request through the ASGI app,
as before that existed). The gateway and the instance run on `--server-cpus` (default cpu 0)
and the load generator on the other cores, so the generator neither takes the servers' CPU nor
waits for it: a refusal's time is the servers' (on a 2-core machine the servers share one core,
and the capacity is that core's). `--server-cpus ''` shares every core, as the runs before
2026-12-02 04:30 did; there the generator's own stalls (150 ms and more) were part of every
latency it measured. By default the generator is `bench.harness.rawload`'s (pre-encoded
requests over keep-alive connections from `--client-processes` processes, arrivals on
absolute times), light enough to offer the spike it is asked for; `--client httpx` is the
client of the first run (~1 ms of CPU per request).

The gateway runs what `podium gateway` runs (its HTTP protocol and early shed, its endpoint
health-checked every 2 s, asyncio's own event loop, its heap frozen after the start);
`--gateway-loop` and `--gateway-heap` list the variants to compare (every combination with
every bound and shed path, in the order given; a setting listed twice runs twice). Each raw
request carries its send time, and the gateway records when it parsed each head, when it
wrote each refusal or began each admitted answer, and how late its event loop woke
(`bench.harness.servertimes`): each row then splits the spike's answers into before the head
was parsed, inside the gateway (and, admitted, the instance) and after, read by the client.
Every quarter second a thread samples the gateway's, the instance's and the generator's CPU,
their threads' wait for a core and their preemptions, each core's busy share
(`bench.harness.proccpu`), and the instance's bound, busy rate, tail factor and requests in
its backend (now, and on average while busy: `depth`) from its `/config`; the last table gives
them per phase (capacity, spike, recovery): where an admitted request's extra time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.gateway_overhead import FEATURES
from bench.harness import free_port, module_command, proccpu, serve, servertimes
from bench.harness.rawload import Target
from bench.overload import Answer, Call, add_client_args, add_phase_args, measure, raw_loops
from podium.gateway.limits import DEFAULT_MAX_IN_FLIGHT_PER_INSTANCE

MODEL = "xgb-example"
WARM_UP_S = 3
"""`bench.overload.measure`'s warm-up before its capacity phase."""


BODY = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 20],
                    "data": FEATURES[0]}]}


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


def run_gateway(http_port: int, upstream: str, bound: int, shed: str, times: Path,
                loop: str, heap: str) -> None:
    """Child mode: a gateway process with one static endpoint and the given in-flight bound,
    its HTTP protocol `podium gateway`'s, with (`shed` early) or without the early shed, its
    endpoint health-checked as `podium gateway` does (every 2 s: an instance marked down by a
    failed connection comes back), on `loop` (`asyncio`'s own, as `podium gateway` runs, or
    `uvloop`), its start's heap `frozen` as `podium gateway` freezes it (or `unfrozen`, as
    before 2026-12-04). What `bench.harness.servertimes` records goes to `times` at the
    exit."""
    import uvicorn

    from bench.harness import servertimes
    from podium.gateway.early_shed import EarlyShed
    from podium.gateway.health import run_health_checks
    from podium.gateway.http_server import bounded_head_protocol
    from podium.gateway.limits import GatewayLimits
    from podium.gateway.process import KEEP_ALIVE_S, freeze_heap
    from podium.gateway.proxy import Gateway
    from podium.routes.table import Endpoint

    limits = GatewayLimits(max_in_flight_per_instance=bound)
    gateway = Gateway(limits=limits)
    gateway.table.add_endpoint(MODEL, "1", Endpoint("xgb-1", upstream))
    gateway.table.set_split(MODEL, {"1": 100})
    protocol = servertimes.timed_protocol(bounded_head_protocol(
        limits.max_header_bytes, shed=EarlyShed(gateway) if shed == "early" else None))
    # the keep-alive of `podium gateway` (uvicorn's default closes idle connections after 5 s)
    class Server(uvicorn.Server):
        """Signals are `main`'s, as in `podium gateway` (uvicorn's own re-raises SIGTERM once
        it stops, ending the process before the times are written)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    server = Server(uvicorn.Config(
        servertimes.TimedApp(gateway.app()), host="127.0.0.1", port=http_port,
        log_level="warning", access_log=False, timeout_keep_alive=KEEP_ALIVE_S, http=protocol,
        backlog=2048))

    async def main() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):  # ends serve(), then the times are written
            asyncio.get_running_loop().add_signal_handler(
                sig, lambda: setattr(server, "should_exit", True))
        tasks = [asyncio.create_task(run_health_checks(gateway.table, interval_s=2.0)),
                 asyncio.create_task(servertimes.loop_lag())]
        if heap == "frozen":
            freeze_heap()
        try:
            await server.serve()
        finally:
            for task in tasks:
                task.cancel()
            servertimes.dump(times)

    if loop == "uvloop":
        import uvloop
        uvloop.run(main())
    else:
        asyncio.run(main())


class Watcher:
    """The instance's measured bound, busy rate, tail factor and requests in its backend, read
    from its `/config` every quarter second while the load runs, and the CPU of the gateway,
    the instance, the load generator and each core (`proccpu`), sampled alike (a thread of
    the generator's process)."""

    def __init__(self, url: str, servers: dict[str, int]) -> None:
        self.url = url
        self.servers = servers
        self.config: list[tuple[float, dict[str, Any]]] = []
        self.cpu: list[proccpu.Sample] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _pids(self) -> dict[str, int]:
        """The servers, and the first of this process's other children (the generator's)."""
        pids = dict(self.servers)
        children: list[int] = []
        for task in Path(f"/proc/{os.getpid()}/task").iterdir():
            with contextlib.suppress(OSError):
                children += [int(c) for c in (task / "children").read_text().split()]
        pids.update({f"generator{i}": pid for i, pid in
                     enumerate(sorted(set(children) - set(self.servers.values())))})
        return pids

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._done.wait(0.25):
                self.cpu.append(proccpu.sample(self._pids()))
                try:
                    admission = client.get(self.url).json()["admission"]
                except (httpx.HTTPError, KeyError, ValueError):
                    continue
                self.config.append((time.monotonic(), admission))

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=10)

    def summary(self, window: tuple[float, float] | None = None) -> dict[str, str]:
        """min/median/max of the bound, the busy rate, the tail factor and the requests in
        the backend, over `window` (monotonic s) or the whole run."""
        rows = [a for at, a in self.config if window is None or window[0] <= at <= window[1]]
        return {"bound": _spread([a["in_flight_bound"] for a in rows]),
                "rate": _spread([a["completions_per_busy_s"] for a in rows
                                 if a["completions_per_busy_s"] is not None]),
                "tail": _spread([a["tail_factor"] for a in rows if "tail_factor" in a]),
                "depth": _spread([a["depth"] for a in rows if "depth" in a]),
                "in_backend": _spread([a["in_flight"] for a in rows if "in_flight" in a])}

    def phases(self, windows: dict[str, tuple[float, float]]) -> dict[str, Any]:
        """Per phase: the CPU shares (generators summed) and the instance's figures."""
        out: dict[str, Any] = {}
        for phase, window in windows.items():
            shares = proccpu.shares(self.cpu, window)
            generator = [k for k in shares if k.startswith("generator")]
            for suffix in ("_cpu", "_wait", "_preempted"):
                shares[f"generator{suffix}"] = round(sum(
                    shares.pop(k) for k in generator if k.endswith(suffix)), 3)
            out[phase] = {**shares, **self.summary(window)}
        return out


def _spread(values: list[float]) -> str:
    """min/median/max of what was read, or '-'."""
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[0]:g}/{ordered[len(ordered) // 2]:g}/{ordered[-1]:g}"


def pin_servers(cpus: str) -> list[str]:
    """The command prefix that runs a server on `cpus`; this process (and the load generator
    it forks) moves to the other cores. Nothing when `cpus` is empty."""
    if not cpus:
        return []
    servers = {int(c) for part in cpus.split(",") for c in _cpu_range(part)}
    others = set(os.sched_getaffinity(0)) - servers
    if not others:
        raise SystemExit(f"--server-cpus {cpus} leaves no core for the load generator")
    os.sched_setaffinity(0, others)
    print(f"servers on cpus {sorted(servers)}, load generator on {sorted(others)}", flush=True)
    return ["taskset", "-c", cpus]


def _cpu_range(part: str) -> range:
    low, _, high = part.partition("-")
    return range(int(low), int(high or low) + 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_phase_args(parser)
    parser.add_argument("--bounds", default="measured,16",
                        help="the gateway's per-instance in-flight bounds to compare: "
                             "measured (the instance's own), or a number")
    parser.add_argument("--target-wait-s", type=float, default=None,
                        help="the instance's --classic-target-wait-s (default: its default)")
    parser.add_argument("--shed", default="early",
                        help="refusal paths to compare, in order: early (from the head, as "
                             "podium gateway does), full (through the app)")
    parser.add_argument("--max-queue", type=int, default=1024, help="the batcher's queue")
    parser.add_argument("--server-cpus", default="0" if len(os.sched_getaffinity(0)) > 1 else "",
                        help="cpus (taskset list) of the gateway and the instance; the load "
                             "generator gets the others ('': no pinning)")
    parser.add_argument("--instance-nice", type=int, default=0,
                        help="the instance's nice value (the gateway's is 0)")
    parser.add_argument("--gateway-loop", default="asyncio",
                        help="the gateway's event loops to compare, in order: asyncio (as "
                             "podium gateway runs), uvloop")
    add_client_args(parser)
    parser.add_argument("--gateway-heap", default="frozen",
                        help="the gateway's heap after its start, to compare in order: frozen "
                             "(as podium gateway does since 2026-12-04), unfrozen")
    parser.add_argument("--gateway-child", nargs=7, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.gateway_child:
        port, upstream, bound, shed, times, loop, heap = opts.gateway_child
        run_gateway(int(port), upstream, int(bound), shed, Path(times), loop, heap)
        return 0

    from podium.examples.builders import write_xgb_example

    pin = pin_servers(opts.server_cpus)

    package = write_xgb_example(Path(tempfile.mkdtemp()) / MODEL)
    logs = Path(tempfile.mkdtemp(prefix="podium-overload-xgb-"))
    print(f"{MODEL} through the gateway: spike {opts.factor}x capacity for {opts.seconds}s, "
          f"batcher max_queue {opts.max_queue}; logs in {logs}", flush=True)
    results: dict[str, dict[str, Any]] = {}
    settings = [(bound, shed, loop, heap) for bound in opts.bounds.split(",")
                for shed in opts.shed.split(",") for loop in opts.gateway_loop.split(",")
                for heap in opts.gateway_heap.split(",")]
    for bound, shed, loop, heap in settings:
        name = f"{bound}/{shed}/{loop}/{heap}"
        name += f"#{sum(1 for n in results if n.startswith(name)) + 1}" if name in results else ""
        tag = name.replace("/", "-").replace("#", "-")
        times = logs / f"times-{tag}.json"
        inst, gw = free_port(), free_port()
        nice = ["nice", "-n", str(opts.instance_nice)] if opts.instance_nice else []
        wait = ["--classic-target-wait-s", str(opts.target_wait_s)] if opts.target_wait_s \
            else []
        instance = [*pin, *nice, sys.executable, "-m", "podium.cli", "serve", str(package),
                    "--host", "127.0.0.1", "--http-port", str(inst), "--grpc-port", "-1",
                    "--max-queue", str(opts.max_queue), *wait]
        gateway_bound = str(DEFAULT_MAX_IN_FLIGHT_PER_INSTANCE) if bound == "measured" else bound
        gateway = [*pin, *module_command("bench.overload_xgb", "--gateway-child", str(gw),
                                         f"http://127.0.0.1:{inst}", gateway_bound, shed,
                                         str(times), loop, heap)]
        env = dict(os.environ)
        with serve(instance, f"http://127.0.0.1:{inst}/health/ready",
                   log=logs / f"i-{tag}.log", env=env, timeout_s=600, poll_s=0.5,
                   stop_timeout_s=120) as served_instance, \
                serve(gateway, f"http://127.0.0.1:{gw}/health/ready",
                      log=logs / f"g-{tag}.log", env=env, timeout_s=600, poll_s=0.5,
                      stop_timeout_s=120) as served_gateway:
            url = f"http://127.0.0.1:{gw}"
            lags: list[float] = []
            counts: dict[str, int] = {}
            stamped: list[tuple[float, int, int, float]] = []
            watcher = Watcher(f"http://127.0.0.1:{inst}/v2/models/{MODEL}/config",
                              {"gateway": served_gateway.pid, "instance": served_instance.pid})
            began = time.monotonic()
            if opts.client == "raw":
                target = Target.post_json(f"{url}/v2/models/{MODEL}/infer",
                                          json.dumps(BODY).encode(), stamp=True,
                                          max_connections=opts.client_connections)
                results[name] = measure(None, opts, raw_loops(
                    target, opts.client_processes, lags, opts.client_nice, counts=counts,
                    stamped=stamped))
                results[name]["client_lag_s"] = round(max(lags), 3)
                results[name].update(counts)
            else:
                results[name] = measure(infer(url), opts)
            results[name]["offered_rps"] = round(results[name]["offered"] / opts.seconds, 1)
            watcher.stop()
            whole = watcher.summary()
            results[name]["instance_bound"] = whole["bound"]
            results[name]["busy_rate"] = whole["rate"]
            if stamped:  # the open loop's first send starts the spike
                spike_at = min(sent for sent, *_ in stamped)
                capacity_at = began + WARM_UP_S
                results[name]["phases"] = watcher.phases({
                    "capacity": (capacity_at, capacity_at + opts.capacity_seconds),
                    "spike": (spike_at, spike_at + opts.seconds),
                    "recovery": (spike_at + opts.seconds,
                                 spike_at + opts.seconds + opts.recovery_seconds)})
        if stamped:  # the gateway wrote its times at its exit
            start = min(sent for sent, *_ in stamped)
            spike = [(stamp, status, seconds) for sent, stamp, status, seconds in stamped
                     if sent < start + opts.seconds]
            results[name].update(servertimes.breakdown(spike, times,
                                                       (start, start + opts.seconds)))
        print(json.dumps({"setting": name, **results[name]}),
              flush=True)
    keys = ["capacity_rps", "offered_rps", "share_2xx", "capacity_p99_ttft_s",
            "admitted_p99_ttft_s", "reject_median_ms", "reject_p99_ms", "num_5xx", "recovery_s",
            "instance_bound", "busy_rate", "client_lag_s", "connections", "connection_waits",
            "capacity_refused", "recovery_share_2xx"]
    parts = ["refusal_before_head_ms", "refusal_inside_ms", "refusal_after_ms",
             "admitted_before_head_ms", "admitted_inside_ms", "admitted_after_ms",
             "server_loop_lag_ms", "server_cpu_share", "server_runqueue_share",
             "server_unmatched"]
    for columns in (keys, parts):
        print(f"\n{'bound/shed/loop/heap':<31}" + "".join(f"{k:>24}" for k in columns))
        for name, r in results.items():
            print(f"{name:<31}" + "".join(f"{r.get(k)!s:>24}" for k in columns))
    print("(parts: median/p99/max ms of the spike's answers, joined by their x-bench-sent "
          "stamp with the gateway's record: before_head = sent to head parsed, inside = head "
          "to answer written (refusal) or begun (admitted), after = to read by the client)")
    print("(for xgb the *_ttft_s columns are the time to the whole answer)")
    cells = ["gateway_cpu", "gateway_wait", "gateway_preempted", "instance_cpu",
             "instance_wait", "instance_preempted", "generator_cpu", "cpu0_busy", "cpu1_busy",
             "bound", "rate", "tail", "depth", "in_backend"]
    print(f"\n{'phase: share of the phase / instance min/median/max':<45}"
          + "".join(f"{k:>20}" for k in cells))
    for name, r in results.items():
        for phase, figures in r.get("phases", {}).items():
            print(f"{name + ' ' + phase:<45}" + "".join(f"{figures.get(k, '-')!s:>20}"
                                                       for k in cells))
    print("(cpu: CPU seconds per second of the phase, all threads; wait: seconds runnable but "
          "waiting for a core; preempted: involuntary context switches a second; cpuN_busy: "
          "the core's busy share, every process on it; depth: the instance's mean requests in "
          "its backend while busy, where it has one)")
    for name, r in results.items():
        print(f"{name}: admitted p99 / capacity p99 "
              f"{r['admitted_p99_ttft_s'] / r['capacity_p99_ttft_s']:.2f}x (target <= 2x), "
              f"rejections p99 {r['reject_p99_ms']} ms (<= 50), 5xx {r['num_5xx']} (0), "
              f"recovery {r['recovery_s']} s (<= 5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
