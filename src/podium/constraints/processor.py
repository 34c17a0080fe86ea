"""The path vLLM loads the constraint processor by: a re-export, kept because installed metadata
names it.

``pyproject.toml`` declares ``podium.constraints.processor:ConstraintLogitsProcessor`` in the
``vllm.logits_processors`` entry-point group, and :data:`podium.constraints.PROCESSOR_FQCN`
says the same; an installation made before the processor moved to
:mod:`podium.constraints.engine.processor` still points here. Moving the entry point would
need every installation redone (and, meanwhile, an engine would load the processor twice), so
this one line stays the stable name.
"""

from podium.constraints.engine.processor import ConstraintLogitsProcessor

__all__ = ["ConstraintLogitsProcessor"]
