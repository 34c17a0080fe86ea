"""Overload: 4x measured capacity against one LLM instance, Podium vs `vllm serve`, defaults.

Podium with its defaults (admission bounds measured at boot for `--target-wait` seconds) vs
`vllm serve` with its defaults (no admission limit), and optionally `vllm serve
--max-num-queued-reqs N` (`vllm-limited`).

    python -m bench.overload [--seconds 60] [--factor 4] [--concurrency 16]
                             [--target-wait 30] [--queued-reqs N]
                             [--servers podium,vllm[,vllm-limited]]
                             [--protocol openai|kserve|grpc]

`--protocol kserve` sends the same request as KServe v2's `generate_stream` (Triton's generate
extension: `text_input`, the sampling options in `parameters`) to Podium alone (`vllm serve`
has no KServe routes); `--protocol grpc` sends it over KServe v2 gRPC, one `ModelStreamInfer`
call each (`harness.grpcload`, with the raw client's loops; a refusal in the stream, its
`error_message`, counts as a 429), and reads the refusals' time inside the server from the
request log lines of the calls it saw refused. `--queued-reqs N` gives Podium (and
`vllm-limited`) an explicit `--max-num-queued-reqs` instead of the measured one. For each
server, in turn, on the same model (the default package, smollm2-135m-instruct, with its
engine args for every server so only admission differs):

1. capacity: a closed loop of `--concurrency` clients for `--capacity-seconds`; capacity is the
   completed requests per second, and its p99 TTFT the baseline;
2. spike: open-loop arrivals (Poisson) at `--factor` x capacity for `--seconds`, each a streamed
   `/v1/completions` (128 prompt words, `--max-tokens` out);
3. recovery: arrivals back at capacity; recovery is the time from the end of the spike until a
   one-second window's p99 TTFT is within 1.5x of the baseline again.

Reports per server: share answered 2xx, p99 TTFT of the admitted, median and p99 time to answer
a rejected one, 5xx count, recovery seconds, and Podium's admission bounds as its model config
shows them (the measured rates behind them); then Podium against the targets (admitted p99
TTFT within the target wait and <= 0.5x `vllm serve`'s, rejections <= 50 ms at p99, 0 5xx,
recovery <= 5 s). A stream that starts with 200 and then carries an error event counts
as an error of its status (vLLM's in-stream overload error counts as 5xx: its code is 503).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.harness import (
    ROOT,
    closed_loop,
    free_port,
    loopback_client,
    median,
    open_loop,
    percentile,
    rawload,
    serve,
)
from bench.harness.grpcload import GrpcTarget
from bench.harness.rawload import Target
from bench.harness.serverlog import refusals_inside

MODEL = "smollm2-135m-instruct"
PROMPT = " ".join(["word"] * 128)


@dataclass
class Answer:
    """One request's outcome."""

    sent: float
    status: int
    seconds: float
    """To the first token (admitted) or to the refusal."""
    ok: bool


Call = Callable[[httpx.AsyncClient], Awaitable[Answer]]
"""One request of the load, sent with the given client."""


def request(protocol: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """The LLM load's request on `protocol`: (path, JSON body) of a streamed generation of
    the same prompt and length."""
    if protocol == "kserve":
        return (f"/v2/models/{MODEL}/generate_stream",
                {"text_input": PROMPT, "parameters": {"max_tokens": max_tokens,
                                                      "ignore_eos": True}})
    return "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens,
                               "stream": True, "ignore_eos": True}


def completion(url: str, max_tokens: int, protocol: str = "openai") -> Call:
    """The LLM load's request: a streamed `/v1/completions` (or KServe's generate_stream)."""
    path, body = request(protocol, max_tokens)
    return lambda client: one(client, url + path, body)


async def one(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Answer:
    """A streamed generation: status, time to the first content chunk, whether it ended
    well."""
    sent = time.monotonic()
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return Answer(sent, r.status_code, time.monotonic() - sent, False)
            first = None
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:  # an error after the 200: its own code counts
                    error = event["error"]  # KServe's is a bare message: a 500
                    code = int(error.get("code") or 500) if isinstance(error, dict) else 500
                    return Answer(sent, code, time.monotonic() - sent, False)
                first = first or time.monotonic()
            return Answer(sent, 200, (first or time.monotonic()) - sent, True)
    except httpx.HTTPError:
        return Answer(sent, 599, time.monotonic() - sent, False)


async def closed_answers(call: Call, concurrency: int, seconds: float) -> list[Answer]:
    """The harness's closed loop sending `call`: `concurrency` clients for `seconds`."""
    async with loopback_client() as client:
        samples = await closed_loop(lambda: call(client), concurrency, seconds=seconds)
    return [sample.value for sample in samples]


async def open_answers(call: Call, phases: list[tuple[float, float]], seed: int = 0
                       ) -> list[Answer]:
    """The harness's open loop sending `call`: Poisson arrivals, `phases` of (rate per
    second, seconds) one after another."""
    async with loopback_client() as client:
        samples = await open_loop(lambda: call(client), phases, seed=seed)
    return [sample.value for sample in samples]


def raw_loops(target: rawload.Sender, processes: int, lags: list[float], nice: int = 0,
              refused: set[str] | None = None, counts: dict[str, int] | None = None,
              stamped: list[tuple[float, int, int, float]] | None = None
              ) -> tuple[Closed, Opened]:
    """`measure`'s loops with rawload's light client sending `target`; each open loop's lag
    behind its schedule goes to `lags`, the ids of refused requests (a sender that names
    them: gRPC's) to `refused`, the connections' counts to `counts`, and a stamped target's
    open-loop answers as (sent, stamp, status, seconds) to `stamped`."""

    def answers(raw: list[tuple[Any, ...]]) -> list[Answer]:
        if refused is not None:
            refused.update(rest[0] for _, status, _, *rest in raw if status == 429 and rest)
        return [Answer(sent, status, seconds, status == 200)
                for sent, status, seconds, *_ in raw]

    def closed(n: int, seconds: float) -> list[Answer]:
        return answers(rawload.closed_loop(target, n, seconds, processes=processes,
                                           nice=nice, counts=counts))

    def opened(phases: list[tuple[float, float]]) -> list[Answer]:
        raw, lag = rawload.open_loop(target, phases, processes=processes, nice=nice,
                                     counts=counts)
        lags.append(lag)
        if stamped is not None:
            stamped.extend((sent, rest[0], status, seconds)
                           for sent, status, seconds, *rest in raw if rest)
        return answers(raw)

    return closed, opened


def p99(values: list[float]) -> float:
    return percentile(values, 99)


Closed = Callable[[int, float], list[Answer]]
"""A closed loop: (clients, seconds) → answers."""
Opened = Callable[[list[tuple[float, float]]], list[Answer]]
"""An open loop: phases of (rate per second, seconds) → answers."""


def measure(call: Call | None, opts: argparse.Namespace,
            loops: tuple[Closed, Opened] | None = None) -> dict[str, Any]:
    """Capacity, the spike and the recovery against one ready server, with httpx sending
    `call`, or with the given `loops` (another client, e.g. `rawload`'s)."""
    if loops is None:
        assert call is not None
        def closed(n: int, seconds: float) -> list[Answer]:
            return asyncio.run(closed_answers(call, n, seconds))

        def opened(phases: list[tuple[float, float]]) -> list[Answer]:
            return asyncio.run(open_answers(call, phases))
    else:
        closed, opened = loops
    closed(2, 3)  # warm up
    base = closed(opts.concurrency, opts.capacity_seconds)
    admitted = [a for a in base if a.ok]
    capacity = len(admitted) / opts.capacity_seconds
    base_p99 = p99([a.seconds for a in admitted])
    spike_end_offset = opts.seconds
    asked = opts.factor * capacity * opts.seconds
    started = time.monotonic()
    answers = opened([(opts.factor * capacity, opts.seconds), (capacity, opts.recovery_seconds)])
    spike = [a for a in answers if a.sent - started < spike_end_offset]
    after = [a for a in answers if a.sent - started >= spike_end_offset]
    ok = [a for a in spike if a.ok]
    rejected = [a.seconds for a in spike if a.status == 429 or (a.status == 503 and
                                                                 a.seconds < 1)]
    return {
        "capacity_rps": round(capacity, 2), "capacity_p99_ttft_s": round(base_p99, 3),
        "capacity_refused": sum(1 for a in base if a.status == 429),
        "recovery_share_2xx": round(sum(1 for a in after if a.ok) / max(1, len(after)), 3),
        "asked": round(asked), "offered": len(spike),
        "share_2xx": round(len(ok) / max(1, len(spike)), 3),
        "admitted_p99_ttft_s": round(p99([a.seconds for a in ok]), 3),
        "rejected": len(rejected),
        "reject_median_ms": round(median(rejected) * 1000, 1) if rejected else None,
        "reject_p99_ms": round(p99(rejected) * 1000, 1) if rejected else None,
        "num_5xx": sum(1 for a in spike + after if a.status >= 500),
        "statuses": {str(s): sum(1 for a in spike if a.status == s)
                     for s in sorted({a.status for a in spike})},
        "recovery_s": recovery(after, started + spike_end_offset, base_p99),
    }


def recovery(after: list[Answer], spike_end: float, base_p99: float) -> float | None:
    """Seconds from the spike's end to the first one-second window (by send time) whose
    admitted p99 TTFT is within 1.5x the baseline; None if none was."""
    windows: dict[int, list[float]] = {}
    for a in after:
        if a.ok:
            windows.setdefault(int(a.sent - spike_end), []).append(a.seconds)
    for second in sorted(windows):
        if p99(windows[second]) <= 1.5 * base_p99:
            return float(second)
    return None


def servers(opts: argparse.Namespace, package_root: Path, model_dir: Path, engine_args: dict
            ) -> dict[str, list[str]]:
    """The command of each server, by name, with `{port}` to fill in."""
    vllm = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
            str(model_dir), "--served-model-name", MODEL, "--host", "127.0.0.1", "--port",
            "{port}", "--disable-uvicorn-access-log"]
    for key, value in engine_args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            vllm.append(flag)
        elif value is False:
            vllm.append("--no-" + key.replace("_", "-"))
        else:
            vllm += [flag, str(value)]
    podium = [sys.executable, "-m", "podium.cli", "serve", str(package_root), "--host",
              "127.0.0.1", "--http-port", "{port}", "--grpc-port", "{grpc_port}",
              "--admission-target-wait-s", str(opts.target_wait)]
    limited = ["--max-num-queued-reqs", str(opts.queued_reqs)] if opts.queued_reqs else []
    return {"podium": podium + limited, "vllm": vllm, "vllm-limited": vllm + limited}


def podium_admission(url: str) -> dict[str, Any]:
    """The admission bounds in force on Podium's instance and the rates behind them."""
    return httpx.get(f"{url}/v2/models/{MODEL}/config", timeout=30).json().get("admission", {})


def add_phase_args(parser: argparse.ArgumentParser) -> None:
    """The spike's phases (what `measure` reads), shared with `overload_xgb.py`."""
    parser.add_argument("--seconds", type=float, default=60, help="length of the spike")
    parser.add_argument("--factor", type=float, default=4, help="spike rate / capacity")
    parser.add_argument("--capacity-seconds", type=float, default=20)
    parser.add_argument("--recovery-seconds", type=float, default=20)
    parser.add_argument("--concurrency", type=int, default=16,
                        help="clients of the closed loop that measures capacity")


def add_client_args(parser: argparse.ArgumentParser) -> None:
    """The load generator: rawload's (default) or httpx's."""
    parser.add_argument("--client", choices=["raw", "httpx"], default="raw",
                        help="raw: rawload's light multi-process client (default); httpx: "
                             "one asyncio process (the runs before 2026-12-04)")
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--client-connections", type=int, default=rawload.MAX_CONNECTIONS,
                        help="connections each raw client process keeps open at most (a "
                             "request finding none free waits, and the wait is in its time)")
    parser.add_argument("--client-nice", type=int, default=0,
                        help="the raw client's nice value (negative needs root): a generator "
                             "that waits for the servers' time slice measures its own wait")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_phase_args(parser)
    parser.add_argument("--target-wait", type=float, default=30,
                        help="Podium's --admission-target-wait-s")
    parser.add_argument("--queued-reqs", type=int, default=None,
                        help="max_num_queued_reqs of Podium (instead of the measured one) and "
                             "of vllm-limited")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--servers", default="podium,vllm")
    parser.add_argument("--protocol", choices=["openai", "kserve", "grpc"], default="openai",
                        help="the load's route: OpenAI's /v1/completions, or KServe v2's "
                             "generate_stream or gRPC ModelStreamInfer (Podium only)")
    add_client_args(parser)
    opts = parser.parse_args()
    if opts.protocol != "openai" and set(opts.servers.split(",")) - {"podium"}:
        parser.error(f"--protocol {opts.protocol}: only --servers podium serves KServe v2")
    if opts.protocol == "grpc" and opts.client != "raw":
        parser.error("--protocol grpc: the raw client's loops send it (--client raw)")

    home = Path(os.environ.get("PODIUM_HOME", ROOT / ".podium"))
    env = {**os.environ, "PODIUM_HOME": str(home), "HF_HUB_OFFLINE": "1",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    os.environ.update(env)
    from podium.package.cache import ModelCache
    from podium.package.defaults import write_default_package
    from podium.package.precision import resolve_auto

    package = write_default_package()
    model_dir = ModelCache().materialize(package).path
    engine_args = dict(package.manifest.engine_args)
    resolved = resolve_auto(model_dir)  # what the package's `precision: auto` runs at here
    if resolved.precision is not None:
        engine_args["dtype"] = resolved.precision.dtype  # vLLM at the same dtype
    print(resolved.describe(MODEL), flush=True)
    commands = servers(opts, package.root, model_dir, engine_args)
    logs = Path(tempfile.mkdtemp(prefix="podium-overload-"))
    print(f"{MODEL} over {opts.protocol}: spike {opts.factor}x capacity for {opts.seconds}s, "
          f"Podium's target wait "
          f"{opts.target_wait}s, max_num_queued_reqs {opts.queued_reqs or 'measured'}; logs in "
          f"{logs}", flush=True)
    results: dict[str, dict[str, Any]] = {}
    for name in opts.servers.split(","):
        port, grpc_port = free_port(), free_port() if opts.protocol == "grpc" else -1
        command = [part.replace("{port}", str(port)).replace("{grpc_port}", str(grpc_port))
                   for part in commands[name]]
        refused: set[str] | None = set() if opts.protocol == "grpc" else None
        url = f"http://127.0.0.1:{port}"
        ready = url + ("/health/ready" if name == "podium" else "/health")
        with serve(command, ready, log=logs / f"{name}.log", env=env, timeout_s=600,
                   poll_s=0.5, stop_timeout_s=120):
            admission = podium_admission(url) if name == "podium" else None
            if opts.client == "raw":
                lags: list[float] = []
                results[name] = measure(None, opts, raw_loops(
                    _target(opts, url, grpc_port), opts.client_processes, lags,
                    opts.client_nice, refused))
                results[name]["client_lag_s"] = round(max(lags), 3)
            else:
                results[name] = measure(completion(url, opts.max_tokens, opts.protocol),
                                        opts)
            if admission is not None:
                results[name]["admission"] = admission
        if name == "podium":
            results[name].update(refusals_inside(logs / f"{name}.log", refused))
        print(json.dumps({"server": name, **results[name]}), flush=True)
    report(results, opts.target_wait)
    return 0


def _target(opts: argparse.Namespace, url: str, grpc_port: int) -> rawload.Sender:
    """What the raw client sends: the streamed generation over HTTP, or over gRPC."""
    if opts.protocol == "grpc":
        return GrpcTarget(f"127.0.0.1:{grpc_port}", MODEL, PROMPT,
                          {"max_tokens": opts.max_tokens, "ignore_eos": True})
    path, body = request(opts.protocol, opts.max_tokens)
    return Target.post_json(url + path, json.dumps(body).encode(), first_chunk=True,
                            max_connections=opts.client_connections)


def report(results: dict[str, dict[str, Any]], target_wait: float) -> None:
    keys = ["asked", "offered", "share_2xx", "capacity_p99_ttft_s", "admitted_p99_ttft_s",
            "reject_median_ms", "reject_p99_ms", "num_5xx", "recovery_s"]
    print(f"\n{'server':<14}" + "".join(f"{k:>22}" for k in keys))
    for name, r in results.items():
        print(f"{name:<14}" + "".join(f"{r[k]!s:>22}" for k in keys))
    mine = results.get("podium")
    if mine is None:
        return
    bounds = mine.get("admission") or {}
    print(f"\npodium admission: max_num_queued_reqs {bounds.get('max_num_queued_reqs')}, "
          f"max_num_queued_tokens {bounds.get('max_num_queued_tokens')} "
          f"({bounds.get('sources')}), rates {bounds.get('rates')}")
    print(f"podium admitted p99 TTFT: {mine['admitted_p99_ttft_s']} s (target <= "
          f"{target_wait:g} s, the target wait); / its capacity p99: "
          f"{mine['admitted_p99_ttft_s'] / mine['capacity_p99_ttft_s']:.2f}x")
    if "vllm" in results:
        print(f"podium admitted p99 / vllm serve's: "
              f"{mine['admitted_p99_ttft_s'] / results['vllm']['admitted_p99_ttft_s']:.2f}x "
              "(target <= 0.5x)")
    print(f"podium refusals inside the server (its request log): "
          f"{ {k: v for k, v in mine.items() if k.startswith(('inside', 'refusals'))} }")
    print(f"podium rejections p99: {mine['reject_p99_ms']} ms (target <= 50); 5xx: "
          f"{mine['num_5xx']} (target 0); recovery: {mine['recovery_s']} s (target <= 5)")


if __name__ == "__main__":
    sys.exit(main())
