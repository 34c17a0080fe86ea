"""Per-request catalogs end to end: Podium's `distinct_items` vs vLLM's structured outputs vs
unconstrained, on one real engine behind Podium's OpenAI server, in one run.

    HF_HUB_OFFLINE=1 python -m bench.constraints_e2e [--requests 64]
        [--concurrency 32] [--min-candidates 20] [--max-candidates 100] [--rounds 2]
        [--catalog package|none]

The served package names the 50,000 titles as its `constraint_catalog` (tokenized when the
instance boots) unless `--catalog none`; the podium figures count the titles its compiles still
had to tokenize (`podium:constraint_strings_tokenized_total`).

Every request asks for 3 to 5 different titles from its own candidates (a different set each
time, drawn from a 50,000-title catalog and listed in the prompt), as a JSON array; streamed
chat completions at temperature 1.0, `--concurrency` at a time. The three modes:

- `podium`: the request's `constraint` (`distinct_items`, min 3, max 5): one attempt;
- `vllm`: `response_format` `json_schema` (an array of the candidates as an `enum`,
  `minItems` 3, `maxItems` 5; no `uniqueItems`: neither xgrammar nor guidance implements it,
  so vLLM refuses the schema, and Podium answers 400 naming `response_format`), which Podium
  hands to vLLM's own structured outputs (xgrammar, a grammar compiled per distinct schema); an
  answer that repeats a title, or is cut off, is asked again, as a user would (up to
  `--attempts` in all);
- `free`: no constraint, one attempt per request (`--free-attempts`): the throughput floor.
  Retrying it would measure cached prompts: a retry finds its prompt in the prefix cache and
  skips the prefill a first attempt pays, and the 135M model's free answers are never valid.
- `matched`: no constraint and `ignore_eos`, each request asking for exactly the tokens of a
  valid answer (3 to 5 of its candidates as `distinct_items` writes them, and the end of
  sequence): the same prompts and the same answer lengths as `podium`, so its answers and
  tokens per second are the unconstrained throughput of the same work.

Reported per mode: valid answers per second (valid / the mode's wall time), answers per second
(all attempts), generated and prompt tokens per second (the usage of every attempt), share
valid at the first attempt, p50 / p99 TTFT and p50 inter-token time (decode time per token
after the first) of every attempt, and for `podium` the time each request waited for its
compiled constraint (the `x-podium-constraint-compile-seconds` header), over all requests and
apart for the opening burst (the `--concurrency` requests sent at once when the run starts)
and the rest, with the compiles' own mean time and the titles they still tokenized (from
/metrics). The server's compiled forms go to a directory of this run: a host store kept from
an earlier run with the same seed would answer every compile.
The modes alternate order between rounds (a shared machine drifts); figures are per round,
then the ratios of the medians: podium / vllm valid answers per second (issue 13's target
>= 2x), podium / free answers and tokens per second and decode rate (>= 0.9x), podium
compile p99 (<= 5 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from tests.support.catalog import make_titles

from bench.harness import (
    check_loopback,
    closed_loop,
    free_port,
    loopback_client,
    median,
    percentile,
    serve,
)

MODEL = "smollm2-135m-instruct"
MIN_ITEMS, MAX_ITEMS = 3, 5
COMPILE_HEADER = "x-podium-constraint-compile-seconds"


@dataclass
class Tally:
    """One mode's run."""

    valid: int = 0
    valid_first: int = 0
    attempts: int = 0
    tokens: int = 0
    prompt_tokens: int = 0
    itl_s: list[float] = field(default_factory=list)
    """Each attempt's decode time per token after its first (the engine's step as a stream
    sees it, the processor's cost included)."""
    ttft_s: list[float] = field(default_factory=list)
    compile_s: list[float] = field(default_factory=list)
    burst_compile_s: list[float] = field(default_factory=list)
    """Compile waits of the requests sent in the run's first second (the opening burst)."""
    started: float = 0.0
    seconds: float = 0.0


def is_valid(text: str, candidates: list[str]) -> bool:
    """A JSON array of 3 to 5 distinct titles, each one of the request's candidates."""
    start = text.find("[")
    try:
        value, _ = json.JSONDecoder().raw_decode(text[start:]) if start >= 0 else (None, 0)
    except json.JSONDecodeError:
        return False
    allowed = set(candidates)
    return (isinstance(value, list) and MIN_ITEMS <= len(value) <= MAX_ITEMS
            and all(isinstance(v, str) and v in allowed for v in value)
            and len(set(value)) == len(value))


def body(mode: str, candidates: list[str], max_tokens: int, tag: str = "",
         length: int | None = None) -> dict[str, Any]:
    """One request; `tag` opens the prompt so no other mode's run finds it in the prefix
    cache (the modes share the candidate lists, not the cached prompts)."""
    listing = "\n".join(f"- {c}" for c in candidates)
    out: dict[str, Any] = {
        "model": MODEL, "stream": True, "temperature": 1.0, "max_tokens": max_tokens,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content":
                      f"{tag}Recommend {MIN_ITEMS} to {MAX_ITEMS} different movies from this list "
                      f"for tonight:\n{listing}\nAnswer only with a JSON array of titles, "
                      "exactly as written above."}]}
    if mode == "matched":  # exactly `length` tokens, unconstrained
        out.update(max_tokens=length, ignore_eos=True)
    elif mode == "podium":
        out["constraint"] = {"type": "distinct_items", "items": candidates, "min": MIN_ITEMS,
                             "max": MAX_ITEMS}
    elif mode == "vllm":
        schema = {"type": "array", "items": {"type": "string", "enum": candidates},
                  "minItems": MIN_ITEMS, "maxItems": MAX_ITEMS}
        out["response_format"] = {"type": "json_schema",
                                  "json_schema": {"name": "picks", "schema": schema}}
    return out


async def attempt(client: httpx.AsyncClient, url: str, payload: dict[str, Any],
                  tally: Tally) -> str:
    """One streamed attempt: its text; records TTFT (and the compile time when said)."""
    sent = time.monotonic()
    parts: list[str] = []
    first = last = None
    completion = 0
    async with client.stream("POST", f"{url}/v1/chat/completions", json=payload) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {(await r.aread())[:300]!r}")
        if COMPILE_HEADER in r.headers:
            waited = float(r.headers[COMPILE_HEADER])
            tally.compile_s.append(waited)
            if sent - tally.started < 1.0:
                tally.burst_compile_s.append(waited)
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or {}
            completion += usage.get("completion_tokens", 0)
            tally.prompt_tokens += usage.get("prompt_tokens", 0)
            for choice in chunk.get("choices", []):
                text = (choice.get("delta") or {}).get("content") or ""
                if text:
                    last = time.monotonic()
                    first = first or last
                parts.append(text)
    tally.tokens += completion
    tally.ttft_s.append((first or time.monotonic()) - sent)
    if first is not None and last is not None and completion > 1:
        tally.itl_s.append((last - first) / (completion - 1))
    return "".join(parts)


async def run_mode(url: str, mode: str, requests: list[list[str]], opts: argparse.Namespace,
                   tag: str = "", lengths: list[int] | None = None) -> Tally:
    """Every request (with its retries) once, `--concurrency` at a time: the harness's closed
    loop, one request per call."""
    tally = Tally()
    tries = {"podium": 1, "free": opts.free_attempts, "matched": 1}.get(mode, opts.attempts)
    work = iter(zip(requests, lengths or [0] * len(requests), strict=True))
    check_loopback(url)

    async def one(client: httpx.AsyncClient) -> None:
        candidates, length = next(work)
        for n in range(tries):
            text = await attempt(client, url, body(mode, candidates, opts.max_tokens, tag,
                                                   length), tally)
            tally.attempts += 1
            if is_valid(text, candidates):
                tally.valid += 1
                tally.valid_first += n == 0
                return

    started = tally.started = time.monotonic()
    async with loopback_client(timeout=600) as client:
        await closed_loop(lambda: one(client), opts.concurrency, requests=len(requests))
    tally.seconds = time.monotonic() - started
    return tally


def pct(values: list[float], q: float) -> float:
    """The harness's percentile, `q` as a fraction."""
    return percentile(values, q * 100)


def summary(mode: str, t: Tally, n: int) -> dict[str, Any]:
    return {"mode": mode, "valid_per_s": round(t.valid / t.seconds, 3),
            "answers_per_s": round(t.attempts / t.seconds, 3),
            "tokens_per_s": round(t.tokens / t.seconds, 2),
            "prompt_tokens_per_s": round(t.prompt_tokens / t.seconds, 1),
            "tokens_per_answer": round(t.tokens / t.attempts, 1) if t.attempts else None,
            "p50_itl_ms": round(pct(t.itl_s, 0.5) * 1000, 1) if t.itl_s else None,
            "valid_first": round(t.valid_first / n, 3), "valid": round(t.valid / n, 3),
            "attempts": t.attempts, "p50_ttft_s": round(pct(t.ttft_s, 0.5), 3),
            "p99_ttft_s": round(pct(t.ttft_s, 0.99), 3), "seconds": round(t.seconds, 1),
            "compile_p50_ms": round(pct(t.compile_s, 0.5) * 1000, 2) if t.compile_s else None,
            "compile_p99_ms": round(pct(t.compile_s, 0.99) * 1000, 2) if t.compile_s else None,
            **_split_compile(t)}


def _split_compile(t: Tally) -> dict[str, Any]:
    """Compile waits of the opening burst and of the requests after it, apart."""
    if not t.compile_s:
        return {}
    later = sorted(t.compile_s)
    for waited in t.burst_compile_s:
        later.remove(waited)
    ms = lambda values, q: round(pct(values, q) * 1000, 2) if values else None  # noqa: E731
    return {"burst_compile_p50_ms": ms(t.burst_compile_s, 0.5),
            "burst_compile_max_ms": ms(t.burst_compile_s, 1.0),
            "later_compile_p50_ms": ms(later, 0.5), "later_compile_p99_ms": ms(later, 0.99),
            "burst_requests": len(t.burst_compile_s)}


def _await_compile_worker(url: str, opts: argparse.Namespace, rng: random.Random,
                          catalog: list[str], timeout_s: float = 120) -> None:
    """Warm-up until the server's compile worker answers (it starts at the first constrained
    request; until it is ready, the server's threads compile)."""
    deadline = time.monotonic() + timeout_s
    while 'compiler="process"' not in httpx.get(f"{url}/metrics", timeout=30).text:
        if time.monotonic() > deadline:
            print("the compile worker never answered: the figures are the threads'", flush=True)
            return
        asyncio.run(run_mode(url, "podium", [rng.sample(catalog, opts.min_candidates)], opts))


def answer_lengths(requests: list[list[str]], rng: random.Random) -> list[int]:
    """For `matched`: the tokens of a valid answer to each request (a JSON array of 3 to 5 of
    its candidates, as `distinct_items` writes it) plus its end of sequence: what the podium
    mode generates, asked of the engine with no constraint."""
    from podium.constraints import TokenizerInfo
    from podium.constraints.compile.distinct import render
    from podium.package.defaults import default_model_dir

    tok = TokenizerInfo.from_pretrained(str(default_model_dir()))
    answers = [render(rng.sample(c, rng.randint(MIN_ITEMS, MAX_ITEMS))) for c in requests]
    return [len(ids) + 1 for ids in tok.encode_batch(answers)]


WORK_FAMILIES = ("podium:constraint_strings_tokenized_total",
                 "podium:constraint_compile_work_seconds_count",
                 "podium:constraint_compile_work_seconds_sum")


LAG_BUCKET = "podium:event_loop_lag_seconds_bucket{le=\""


def _scrape(url: str) -> dict[str, float]:
    """The server's compile-work counters so far, each summed over its labels, and its
    event-loop lag histogram's cumulative buckets (keyed by their bound)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    found = {name: sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith(name + "{")) for name in WORK_FAMILIES}
    for line in text.splitlines():
        if line.startswith(LAG_BUCKET):
            bound, value = line[len(LAG_BUCKET):].split('"}', 1)
            found["lag:" + bound] = float(value)
    return found


def _compile_work(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """A run's compiles, their mean own time (the wait excluded), titles still tokenized, and
    how late the server's event loop ran meanwhile (`podium:event_loop_lag_seconds`, probed
    every 0.1 s): the share of probes later than 5 ms, and the bucket bounds its p50 and p99
    fall under. A compile's wait can be no shorter than that lag."""
    tokenized, count, total = (after[n] - before[n] for n in WORK_FAMILIES)
    figures: dict[str, Any] = {
        "compiles": int(count), "titles_tokenized": int(tokenized),
        "compile_work_mean_ms": round(1000 * total / count, 2) if count else None}
    lag = sorted((float(k[4:]), after[k] - before.get(k, 0.0)) for k in after
                 if k.startswith("lag:"))
    probes = lag[-1][1] if lag else 0.0
    if probes:
        under_5ms = next(c for bound, c in lag if bound >= 0.005)
        figures["loop_lag_probes"] = int(probes)
        figures["loop_lag_over_5ms"] = round(1 - under_5ms / probes, 3)
        for q in (0.5, 0.99):
            bound = next(b for b, c in lag if c >= q * probes)
            figures[f"loop_lag_p{int(q * 100)}_under_ms"] = 1000 * bound
    return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=64, help="requests per mode and round")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--min-candidates", type=int, default=20)
    ap.add_argument("--max-candidates", type=int, default=100)
    ap.add_argument("--attempts", type=int, default=3, help="attempts when retrying (vllm)")
    ap.add_argument("--free-attempts", type=int, default=1, help="attempts for free")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--modes", default="podium,vllm,free,matched")
    ap.add_argument("--catalog", choices=("package", "none"), default="package",
                    help="package: the served package names the 50,000 titles as its "
                    "constraint_catalog (tokenized at boot); none: requests' titles are "
                    "tokenized when first named")
    opts = ap.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from podium.package.defaults import default_llm_manifest
    from podium.package.package import write_manifest

    rng = random.Random(0)
    catalog = make_titles(50_000)
    manifest = default_llm_manifest()
    root = Path(tempfile.mkdtemp(prefix="podium-constraints-e2e-package-"))
    if opts.catalog == "package":
        (root / "catalog.txt").write_text("\n".join(catalog) + "\n")
        manifest["constraint_catalog"] = "catalog.txt"
    package = write_manifest(root, manifest)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = Path(tempfile.mkdtemp(prefix="podium-constraints-e2e-")) / "serve.log"
    # compiled forms of this run only: a host store kept from an earlier run (same seed, same
    # specs) would answer every compile from it, and the compile figures would be hits
    forms = tempfile.mkdtemp(prefix="podium-constraints-e2e-forms-",
                             dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    os.environ["PODIUM_CONSTRAINT_CACHE"] = forms
    command = [sys.executable, "-m", "podium.cli", "serve", str(package.root), "--host",
               "127.0.0.1", "--http-port", str(port), "--grpc-port", "-1"]
    modes = opts.modes.split(",")
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    print(f"{opts.requests} requests per mode and round, concurrency {opts.concurrency}, "
          f"{opts.min_candidates}-{opts.max_candidates} candidates each, catalog "
          f"{opts.catalog}; log {log}", flush=True)
    with serve(command, f"{url}/health/ready", log=log, timeout_s=900, poll_s=0.5,
               stop_timeout_s=120):
        warm = [rng.sample(catalog, opts.min_candidates) for _ in range(4)]
        for mode in modes:  # warm-up: first-use costs (numba, xgrammar) out of the figures
            asyncio.run(run_mode(url, mode, warm, opts, lengths=[8] * len(warm)))
        if "podium" in modes:
            _await_compile_worker(url, opts, rng, catalog)
        for round_no in range(opts.rounds):
            requests = [rng.sample(catalog, rng.randint(opts.min_candidates,
                                                        opts.max_candidates))
                        for _ in range(opts.requests)]
            lengths = answer_lengths(requests, random.Random(round_no))
            for mode in modes if round_no % 2 == 0 else modes[::-1]:  # A/B/B/A over modes
                tag = f"(set {mode}-{round_no}) "  # a cold prefix cache for every run
                before = _scrape(url)
                figures = summary(mode, asyncio.run(run_mode(url, mode, requests, opts, tag,
                                                             lengths)), opts.requests)
                if mode == "podium":
                    figures.update(_compile_work(before, _scrape(url)))
                results[mode].append(figures)
                print(json.dumps({"round": round_no, **figures}), flush=True)

    shutil.rmtree(forms, ignore_errors=True)

    def med(mode: str, key: str) -> float:
        return median(r[key] for r in results[mode])

    if "podium" in results and "vllm" in results:
        print(f"podium / vllm valid answers per second: "
              f"{med('podium', 'valid_per_s') / med('vllm', 'valid_per_s'):.2f}x (target >= 2)")
    if "podium" in results and "free" in results:
        print(f"podium / free answers per second: "
              f"{med('podium', 'answers_per_s') / med('free', 'answers_per_s'):.2f}x, "
              f"tokens per second: "
              f"{med('podium', 'tokens_per_s') / med('free', 'tokens_per_s'):.2f}x "
              "(free's answers are longer and fewer: `matched` is the like-for-like peer)")
        print(f"podium / free decode rate per stream (free's p50 ITL / podium's): "
              f"{med('free', 'p50_itl_ms') / med('podium', 'p50_itl_ms'):.2f}x")
    if "podium" in results and "matched" in results:
        print(f"podium / matched (unconstrained, same prompts and answer lengths) answers per "
              f"second: {med('podium', 'answers_per_s') / med('matched', 'answers_per_s'):.2f}x"
              f", tokens per second: "
              f"{med('podium', 'tokens_per_s') / med('matched', 'tokens_per_s'):.2f}x "
              "(target >= 0.9)")
    if results.get("podium"):
        print(f"podium compile p99: {max(r['compile_p99_ms'] for r in results['podium'])} ms "
              "(target <= 5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
