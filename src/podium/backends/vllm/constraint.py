"""A request's `constraint` on the vLLM engine, the one path for both protocols: admitted into
the engine's extra arguments (OpenAI's `vllm_xargs`, KServe's `SamplingParams.extra_args`),
then compiled before the engine sees it, off the event loop, never in the engine step; and a
package's constraint catalog prepared at load."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any


def admit(spec: object, *, min_tokens: object, xargs: object = None,
          xargs_field: str = "vllm_xargs", also_constrained_by: str | None = None
          ) -> dict[str, Any]:
    """The request's extra arguments with its constraint added; a 400 naming what is wrong
    (the spec, the sampling it must live with, a grammar of vLLM's beside it)."""
    from podium.constraints import admit_constraint

    return admit_constraint(spec, min_tokens=min_tokens, xargs=xargs, xargs_field=xargs_field,
                            also_constrained_by=also_constrained_by)


async def precompile(xargs: dict[str, Any] | None, engine: Any) -> float | None:
    """Compile the admitted constraint `xargs` carries for `engine`'s model; the seconds it
    took, or None without a constraint (or without an engine: the test doubles)."""
    if not xargs or engine is None:
        return None
    from podium.constraints import precompile_xargs

    return await precompile_xargs(xargs, engine.model_config)


async def prepare_catalog(root: Path, name: str, engine: Any) -> None:
    """The package's constraint catalog `name` read, checked and tokenized where this
    instance compiles constraints (``ConstraintPrecompiler.prepare``)."""
    from podium.constraints import precompiler_for
    from podium.package.catalog import FIELD, read_catalog
    from podium.package.paths import named_path

    path = named_path(root, name, FIELD)
    strings = await asyncio.to_thread(read_catalog, path, root)
    config = engine.model_config
    compiler = precompiler_for(str(config.tokenizer), int(config.get_vocab_size()))
    await compiler.prepare(path, strings)
