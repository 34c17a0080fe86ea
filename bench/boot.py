"""Boot to ready of the default LLM by start path, and its serving speed, in one run.

    python -m bench.boot [--modes spawn,fork] [--rounds 1] [--prompts 64]
    python -m bench.boot --modes zygote,default,vllm --loads 128/64/64,32/256/32

Each run starts `podium serve` of the default package (SmolLM2-135M-Instruct, already in the
model cache) with one start path:

- `off`: no preloader (``PODIUM_PRELOAD=0``): engine core and worker spawned, as vLLM does;
- `spawn`: engine core forked from the preloader, worker spawned
  (``PODIUM_PRELOAD_WORKER_FORK=0``);
- `fork`: engine core forked from the preloader, worker forked from it (the default);
- `zygote`: the server forked from a zygote with vLLM and the server imported (what `podium up`'s
  local runtime does for its instances, `podium.preload.zygote`), its engine preloader forked
  from the zygote too; the zygote is started (and its import waited for) before the clock
  starts, as it is by the runtime's first instance;
- `iomp`: as `fork`, with Intel OpenMP (the `intel-openmp` wheel's ``libiomp5.so``) preloaded
  instead of torch's libgomp, as vLLM's CPU guide recommends;
- `tcmalloc`: as `fork`, with Debian's tcmalloc preloaded (`libtcmalloc-minimal4`,
  ``PODIUM_ENGINE_TCMALLOC=1``); `both`: tcmalloc and Intel OpenMP. The other modes leave
  tcmalloc out (``PODIUM_ENGINE_TCMALLOC=0``) but `zygote`, which has the default;
- `default`: `podium serve` with every default (tcmalloc, worker forked, its OpenMP threads
  chosen at boot: both cores of this 2-core kind, `podium.backends.vllm.worker_threads`);
- `one-thread`: as `default` with ``PODIUM_WORKER_THREADS=1``: vLLM's own binding (one thread,
  one core reserved), the default before the choice at boot;
- `spin`: as `default` with vLLM's spinning wait (``PODIUM_ENGINE_SPIN=1``, the default since
  the 18:11 run); `quiet`: the readers sleep on vLLM's socket instead (``PODIUM_ENGINE_SPIN=0``,
  `podium.preload.waits`; the default in the 18:11 and 18:35 runs);
- `spawn2`: as `default` (two threads) with the worker spawned (``PODIUM_PRELOAD_WORKER_FORK=0``):
  its team bound by the OpenMP runtime from vLLM's variables, the control for the forked
  worker's own binding;
- `zygote-kvwrite`: as `zygote`, with vLLM writing its whole KV cache with zeros at boot
  (``PODIUM_KV_LAZY_ZERO=0``), the control for `podium.engine_patches.kv_lazy_zero`;
- `vllm-eager`: as `vllm`, with ``--enforce-eager`` (Podium's CPU default mode);
- `omp2`: the worker's OpenMP bound to CPUs 0-1 by ``VLLM_CPU_OMP_THREADS_BIND=0-1``, two
  threads, none reserved (spawned until `podium.preload.worker` bound a team of several
  threads; forked since, what `default` now chooses on 2 cores);
- `MODE-compiled` (e.g. `zygote-compiled`, `default-compiled`): MODE serving the default
  package with ``engine_mode: compiled``, booted from Podium's compile cache (a temporary
  ``PODIUM_COMPILE_CACHE``, filled before the first run by `podium materialize`, untimed; its
  time is printed: what announce pays once); `MODE-eager`: MODE serving it with
  ``engine_mode: eager``, the eager control whatever `auto` resolves to (it stays eager on CPU
  today; a compiled-where-cached rule was measured with it, docs/benchmarks.md);
- `vllm`: the reference, `vllm serve` of the same model folder with vLLM's defaults
  (`python -m vllm.entrypoints.openai.api_server --model DIR`: the `vllm` console script fails
  under the `vllm-cpu` distribution) but its KV cache, 4 GiB as Podium's
  (``VLLM_CPU_KVCACHE_SPACE``), ready when its `/health` answers; `vllm-fp32`: the same
  with ``--dtype float32`` (what Podium's `precision: auto` picks on a CPU without bf16).

It measures the wall time from the process start to `/health/ready` answering 200, then to the
first chat completion answered, the boot steps from /health/ready, the CPUs the worker's
threads may run on (`Cpus_allowed_list` of each thread), then output tokens/s under vLLM's
serving benchmark (random 128 in / 64 out, or `--input` / `--output`, concurrency 16,
`--prompts` requests; `--loads IN/OUT/PROMPTS,...` runs several loads on each boot). The modes
alternate (A B B A ...) so drift in the machine's load falls on each. Prints one line per run,
then medians and each mode's ratio to the first.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.harness import free_port, median, serve

IOMP = str(Path(sys.prefix) / "lib" / "libiomp5.so")
NO_TCMALLOC = {"PODIUM_ENGINE_TCMALLOC": "0"}
ENVS = {"off": {"PODIUM_PRELOAD": "0", **NO_TCMALLOC},
        "spawn": {"PODIUM_PRELOAD_WORKER_FORK": "0", **NO_TCMALLOC},
        "fork": {"PODIUM_PRELOAD_WORKER_FORK": "1", **NO_TCMALLOC},
        "zygote": {"PODIUM_PRELOAD_WORKER_FORK": "1"},
        "iomp": {"PODIUM_PRELOAD_WORKER_FORK": "1", "LD_PRELOAD": IOMP, **NO_TCMALLOC},
        "tcmalloc": {"PODIUM_PRELOAD_WORKER_FORK": "1", "PODIUM_ENGINE_TCMALLOC": "1"},
        "both": {"PODIUM_PRELOAD_WORKER_FORK": "1", "LD_PRELOAD": IOMP,
                 "PODIUM_ENGINE_TCMALLOC": "1"},
        "default": {},
        "one-thread": {"PODIUM_WORKER_THREADS": "1"},
        "spin": {"PODIUM_ENGINE_SPIN": "1"},
        "quiet": {"PODIUM_ENGINE_SPIN": "0"},
        "spawn2": {"PODIUM_WORKER_THREADS": "2", "PODIUM_PRELOAD_WORKER_FORK": "0"},
        "zygote-kvwrite": {"PODIUM_PRELOAD_WORKER_FORK": "1", "PODIUM_KV_LAZY_ZERO": "0"},
        "omp2": {"VLLM_CPU_OMP_THREADS_BIND": "0-1"},
        # vLLM's CPU default sizes the KV cache from --gpu-memory-utilization (0.92 of the
        # machine's memory), which a shared machine refuses at boot: Podium's 4 GiB instead
        **{mode: {"VLLM_CPU_KVCACHE_SPACE": "4"} for mode in ("vllm", "vllm-fp32", "vllm-eager")}}
VLLM = {"vllm": [], "vllm-fp32": ["--dtype", "float32"], "vllm-eager": ["--enforce-eager"]}
"""The reference modes: `vllm serve`'s arguments beyond the model and the address."""
STEPS = ("check engine", "start engine")
LOADS: list[tuple[int, int, int]] = [(128, 64, 64)]
"""Input tokens, output tokens and requests of each serving benchmark run on a boot
(`--input`, `--output`, `--prompts`, or `--loads`)."""


@dataclass
class Run:
    mode: str
    ready_s: float
    first_s: float
    steps: dict[str, float]
    worker_cpus: str
    tok_s: dict[str, float]
    """Output tokens/s per load (`IN/OUT`)."""
    cpu_ms_per_tok: dict[str, float]
    """CPU time of the engine's processes (engine core and worker, user + system) per output
    token during each load: far less sensitive than tokens/s to a busy machine."""
    split_ms_per_tok: dict[str, dict[str, float]]
    """The same per process during each load: `frontend` (the server process itself),
    `core` (the engine core), `worker` (the model runner, the deepest process), and `client`
    (this process: the benchmark's load generator, on the same two cores)."""
    parts: dict[str, float]
    """The parts of `start engine` (its sub-steps in /health/ready), seconds each."""


def _worker_cpus(pid: int) -> str:
    """The distinct `Cpus_allowed_list` values of the worker's threads. The worker is the
    deepest process under the server (server → [preloader →] engine core → worker; a forked
    worker keeps its parent's process name, so it is found by depth, not name)."""
    def depth(process: psutil.Process) -> int:
        n = 0
        while process.pid != pid:
            process, n = psutil.Process(process.ppid()), n + 1
        return n

    children = psutil.Process(pid).children(recursive=True)
    if not children:
        return "?"
    worker = max(children, key=depth)
    found = set()
    for task in Path(f"/proc/{worker.pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list"):
                found.add(line.split()[1])
    return "|".join(sorted(found))


COMPILED = "-compiled"
COMPILED_PACKAGE: list[str] = []
"""The compiled variant's package directory, once written (`compiled_package`)."""


def compiled_package(workdir: Path) -> str:
    """The default package with `engine_mode: compiled`, its build compiled into the compile
    cache (PODIUM_COMPILE_CACHE, set by the caller) before any timed run."""
    from podium.package.defaults import default_llm_manifest
    from podium.package.package import write_manifest

    if not COMPILED_PACKAGE:
        root = write_manifest(workdir / "compiled-package",
                              {**default_llm_manifest(), "engine_mode": "compiled"}).root
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "podium.cli", "materialize", str(root)],
                              capture_output=True, text=True, check=False)
        print(f"podium materialize (compile at announce) {time.monotonic() - started:.1f}s: "
              f"{(done.stdout + done.stderr).strip().splitlines()[-1:]}", flush=True)
        if done.returncode != 0:
            raise RuntimeError(f"compiling the compiled package failed:\n{done.stderr[-3000:]}")
        COMPILED_PACKAGE.append(str(root))
    return COMPILED_PACKAGE[0]


EAGER = "-eager"


def eager_package(workdir: Path) -> str:
    """The default package with `engine_mode: eager`: eager whatever `auto` resolves to."""
    from podium.package.defaults import default_llm_manifest
    from podium.package.package import write_manifest

    root = workdir / "eager-package"
    if not (root / "podium.json").is_file():
        write_manifest(root, {**default_llm_manifest(), "engine_mode": "eager"})
    return str(root)


def measure(mode: str, log: Path, prompts: int, timeout_s: float, zygote: Any = None) -> Run:
    http_port = free_port()
    argv = ["-m", "podium.cli", "serve", "--host", "127.0.0.1",
            "--http-port", str(http_port), "--grpc-port", str(free_port())]
    if mode.removesuffix(BEFORE).endswith(COMPILED):
        argv.append(compiled_package(log.parent))
    elif mode.removesuffix(BEFORE).endswith(EAGER):
        argv.append(eager_package(log.parent))
    base = f"http://127.0.0.1:{http_port}"
    env = {**os.environ, **ENVS[_settings(mode)], **_tree_env(mode)}
    ready_url = f"{base}/health/ready"
    if mode in VLLM:
        from podium.package.defaults import default_model_dir

        argv = ["-m", "vllm.entrypoints.openai.api_server", "--model", str(default_model_dir()),
                "--host", "127.0.0.1", "--port", str(http_port), "--disable-uvicorn-access-log",
                *VLLM[mode]]
        ready_url = f"{base}/health"
    started = time.monotonic()
    if zygote is not None:
        return _measure_zygote(mode, zygote, argv, base, env, log, prompts, timeout_s)
    with serve([sys.executable, *argv], ready_url, timeout_s=timeout_s, log=log,
               poll_s=0.1, env=env, stop_timeout_s=120) as served:
        ready = {"boot_steps": []} if mode in VLLM else served.ready.json()
        return _served(mode, base, served.pid, ready, started, served.boot_s, prompts)


def _measure_zygote(mode: str, zygote: Any, argv: list[str], base: str, env: dict[str, str],
                    log: Path, prompts: int, timeout_s: float) -> Run:
    started = time.monotonic()
    with log.open("ab") as out:
        child = zygote.spawn(argv, out=out, env=env)
    if child is None:
        raise RuntimeError("the zygote did not fork the server (see the log above)")
    child.stdin.write(b"go\n")
    child.stdin.close()
    try:
        while True:
            if child.poll() is not None:
                raise RuntimeError(f"the server exited; log {log}")
            with contextlib.suppress(httpx.HTTPError):
                answer = httpx.get(f"{base}/health/ready", timeout=5)
                if answer.status_code == 200:
                    break
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"not ready after {timeout_s} s; log {log}")
            time.sleep(0.1)
        boot_s = time.monotonic() - started
        return _served(mode, base, child.pid, answer.json(), started, boot_s, prompts)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + 120
        while child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)


def _served(mode: str, base: str, pid: int, ready: dict, started: float, boot_s: float,
            prompts: int) -> Run:
    from podium.package.defaults import default_model_dir

    model = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]
    answer = httpx.post(f"{base}/v1/chat/completions", timeout=300, json={
        "model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]})
    answer.raise_for_status()
    first_s = time.monotonic() - started
    steps = {step: sum(s["seconds"] for s in ready["boot_steps"]
                       if s["step"].startswith(step)) for step in STEPS}
    print("  steps: " + ", ".join(f"{s['step']} {s['seconds']:.2f}s" for s in ready["boot_steps"]),
          flush=True)
    parts = {p["step"]: p["seconds"] for s in ready["boot_steps"]
             if s["step"].startswith("start engine") for p in s.get("steps", [])}
    if parts:
        print("  start engine: " + ", ".join(f"{name} {secs:.2f}s" for name, secs in parts.items()),
              flush=True)
    zygote = _base(mode) == "zygote"
    cpus = _worker_cpus(pid) if not zygote else "?"
    tok_s: dict[str, float] = {}
    cpu_ms: dict[str, float] = {}
    split: dict[str, dict[str, float]] = {}
    for input_len, output_len, num in (LOADS if prompts else []):
        from bench.harness.vllm_serving import serving_benchmark

        engine = psutil.Process(pid).children(recursive=True)
        if zygote:  # its preloader and engine are the zygote's children
            engine = [p for p in psutil.process_iter() if _under(p, pid)]
        roles = _roles(pid, engine)
        before = sum(_cpu(p) for p in engine)
        roles_before = {role: _cpu(p) for role, p in roles.items()}
        result = serving_benchmark(f"{base}", model, default_model_dir(), num, 16,
                                   ready_check=False, input_len=input_len, output_len=output_len)
        name = f"{input_len}/{output_len}"
        tok_s[name] = result["output_throughput"]
        cpu_ms[name] = (1000 * (sum(_cpu(p) for p in engine) - before)
                        / result["total_output_tokens"])
        split[name] = {role: 1000 * (_cpu(p) - roles_before[role]) / result["total_output_tokens"]
                       for role, p in roles.items()}
        print(f"  {name}: CPU ms/token " + ", ".join(f"{role} {ms:.2f}"
                                                   for role, ms in split[name].items()),
              flush=True)
    return Run(mode, boot_s, first_s, steps, cpus, tok_s, cpu_ms, split, parts)


def _roles(pid: int, engine: list[psutil.Process]) -> dict[str, psutil.Process]:
    """The server (`frontend`), its engine core, its worker and this process (`client`): the
    engine core is the worker's parent, the worker the engine's deepest process."""
    roles = {"frontend": psutil.Process(pid), "client": psutil.Process()}
    depth = {}
    for process in engine:
        with contextlib.suppress(psutil.Error):
            depth[process] = len(process.parents())
    if depth:
        worker = max(depth, key=depth.__getitem__)
        roles["worker"] = worker
        with contextlib.suppress(psutil.Error):
            roles["core"] = worker.parent()
    return roles


def _under(process: psutil.Process, pid: int) -> bool:
    """`process` is the server `pid`'s engine: a child of its preloader, which the zygote
    titles after the server (`podium.preload.zygote.PRELOADER_TITLE`)."""
    with contextlib.suppress(psutil.Error):
        return any(f"preloader of server {pid}" in " ".join(p.cmdline())
                   for p in process.parents())
    return False


def _cpu(process: psutil.Process) -> float:
    try:
        times = process.cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return times.user + times.system


def _line(run: Run) -> str:
    steps = "  ".join(f"{name} {run.steps[name]:5.1f}s" for name in STEPS)
    loads = "; ".join(f"{name}: output {tok:6.1f} tok/s, {run.cpu_ms_per_tok[name]:5.1f} engine "
                      "CPU ms/token" for name, tok in run.tok_s.items())
    return (f"{run.mode:<15} ready {run.ready_s:6.1f}s  first answer {run.first_s:6.1f}s  "
            f"({steps})  worker CPUs {run.worker_cpus}  {loads}")


BEFORE = "@before"
BEFORE_SRC: list[str] = []
"""`--before`: the source tree (its `src`) the MODE@before modes run from."""


def _base(mode: str) -> str:
    """The mode's start path: `zygote` for zygote, zygote-compiled, zygote-kvwrite and
    zygote@before."""
    plain = _settings(mode)
    return "zygote" if plain.startswith("zygote") else plain


def _settings(mode: str) -> str:
    """The mode's entry in ENVS."""
    return mode.removesuffix(BEFORE).removesuffix(COMPILED).removesuffix(EAGER)


def _tree_env(mode: str) -> dict[str, str]:
    """MODE@before runs the `--before` tree's Podium (nothing else on its path)."""
    return {"PYTHONPATH": BEFORE_SRC[0]} if mode.endswith(BEFORE) else {}


def _zygote(workdir: Path, mode: str = "zygote") -> Any:
    """A started zygote, its import waited for (printed: the runtime's standby cost)."""
    from podium.preload.spawn import Zygote

    workdir = workdir / mode.replace("@", "-")
    workdir.mkdir(parents=True, exist_ok=True)
    zygote = Zygote(workdir, base_env={**os.environ, **ENVS["zygote"], **_tree_env(mode)})
    started = time.monotonic()
    zygote.start()
    while not zygote.ready():
        if not zygote.alive():
            raise RuntimeError(f"the zygote exited; log {zygote.log_path}")
        time.sleep(0.1)
    print(f"zygote ready (its import) in {time.monotonic() - started:.1f}s", flush=True)
    return zygote


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="spawn,fork",
                        help="comma-separated: off,spawn,fork,zygote,iomp")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each mode (A B B A ...)")
    parser.add_argument("--prompts", type=int, default=64,
                        help="requests of the serving benchmark (0: boot only)")
    parser.add_argument("--timeout-s", type=float, default=900)
    parser.add_argument("--logs", default=None, help="keep each run's server log in this folder")
    parser.add_argument("--input", type=int, default=128, help="prompt tokens of the load")
    parser.add_argument("--output", type=int, default=64, help="output tokens of the load")
    parser.add_argument("--loads", default=None,
                        help="IN/OUT/PROMPTS,...: several loads on each boot (instead of "
                             "--input, --output, --prompts)")
    parser.add_argument("--before", default=None,
                        help="a source tree's src folder (e.g. from `git archive REV src`): "
                             "modes named MODE@before run its Podium, for before/after in one "
                             "run")
    args = parser.parse_args()
    if args.before:
        BEFORE_SRC.append(str(Path(args.before).resolve()))
    LOADS[:] = [(args.input, args.output, args.prompts)]
    if args.loads:
        LOADS[:] = [(int(i), int(o), int(n)) for i, o, n in
                    (load.split("/") for load in args.loads.split(","))]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    modes = args.modes.split(",")
    from podium.package.defaults import default_model_dir

    default_model_dir()  # in the cache before the first run: no run pays materialization
    if args.prompts:
        import vllm.benchmarks.serve  # noqa: F401  (the client's import, before any boot)
    order = [m for i in range(args.rounds) for m in (modes if i % 2 == 0 else modes[::-1])]
    runs: list[Run] = []
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.logs or scratch
        Path(tmp).mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("PODIUM_COMPILE_CACHE", str(Path(tmp) / "compiled"))
        trees = {BEFORE if m.endswith(BEFORE) else "" for m in modes if _base(m) == "zygote"}
        zygotes = {tree: _zygote(Path(tmp), "zygote" + tree) for tree in sorted(trees)}
        try:
            for i, mode in enumerate(order):
                tree = BEFORE if mode.endswith(BEFORE) else ""
                run = measure(mode, Path(tmp) / f"{mode}-{i}.log", args.prompts, args.timeout_s,
                              zygotes[tree] if _base(mode) == "zygote" else None)
                print(_line(run), flush=True)
                runs.append(run)
        finally:
            for zygote in zygotes.values():
                zygote.stop()
    print()
    first = None
    for mode in modes:
        mine = [r for r in runs if r.mode == mode]
        ready, answer = median(r.ready_s for r in mine), median(r.first_s for r in mine)
        first = first or ready
        spread = f"ready {min(r.ready_s for r in mine):.1f}..{max(r.ready_s for r in mine):.1f}s"
        loads = "".join(
            f"; {name}: output {median(r.tok_s[name] for r in mine):6.1f} tok/s "
            f"({min(r.tok_s[name] for r in mine):.1f}..{max(r.tok_s[name] for r in mine):.1f}), "
            f"{median(r.cpu_ms_per_tok[name] for r in mine):.1f} engine CPU ms/token"
            for name in (mine[0].tok_s if mine else {}))
        print(f"median {mode:<15} ready {ready:6.1f}s  first answer {answer:6.1f}s  "
              f"({len(mine)} runs, {spread}; vs {modes[0]}: ready {ready / first:.2f}x){loads}")
        if mine and mine[0].parts:
            print(f"       {mode:<15} start engine: " + ", ".join(
                f"{part} {median(r.parts.get(part, 0.0) for r in mine):.2f}s"
                for part in mine[0].parts))
        for name in (mine[0].split_ms_per_tok if mine else {}):
            print(f"       {mode:<15} {name}: CPU ms/token " + ", ".join(
                f"{role} {median(r.split_ms_per_tok[name].get(role, 0.0) for r in mine):.2f}"
                for role in mine[0].split_ms_per_tok[name]))


if __name__ == "__main__":
    main()
