"""The engine preloader: a process with vLLM already imported that engine cores fork from.

Without it, each engine start pays for importing vLLM twice more after the server's own
import: the engine core is a `spawn`ed interpreter (~13 s here), and its worker another
(~12 s). With it:

- `podium serve` starts the preloader first thing in its boot (`start`, the boot step
  "start preloader"): a multiprocessing fork server whose interpreter imports vLLM's engine
  core, executor and CPU worker (`podium.preload.warm`) while the server imports vLLM's
  serving layer beside it, on the other core.
- The engine core is forked from it (`engine_context`, around vLLM's `AsyncLLM` start); its
  worker is still spawned, as vLLM does on CPU (`podium.preload.process.WORKER_METHOD`).

No state of the preloader leaks into the engine (`podium.preload.process`):

- **environment**: a fork server's children inherit *its* environment, from when it started,
  not the server's when the engine starts. So the server's whole environment at the engine's
  start (what vLLM's platform and Podium's engine settings put there) is sent with the
  process and replaces the child's before vLLM runs. Variables read when a library loads
  (``LD_*``, ``OMP_*``, ``KMP_*``, ``TORCH*``, …) cannot be replaced after the fact: the
  preloader starts with the values vLLM's CPU platform sets for its engine core
  (`podium.preload.environment`), and an engine whose values differ from those is started the
  usual way (spawn), with a warning naming them.
- **threads**: the preloader only imports (importing vLLM leaves a few native threads; a fork
  copies only the forking one); the engine core forked from it does not run the model, and
  its worker, which does, is forked from it before any OpenMP region ran there and binds its
  OpenMP team itself (`podium.preload.worker`), or is spawned as before.

A preloader that is gone (crashed, killed) or cannot be reached is bypassed with a warning:
the engine core is spawned as without it. ``PODIUM_PRELOAD=0`` turns it off. The engine
core's exit is watched through a pidfd, not the fork server's status pipe, so the engine
outlives a preloader that dies after starting it.
"""

from __future__ import annotations

from podium.preload.server import engine_context, start, stop

__all__ = ["engine_context", "start", "stop"]
