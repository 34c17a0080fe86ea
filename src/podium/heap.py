"""A long-lived process's start-up heap moved out of the cyclic collector's reach.

What a process built before serving (imported modules, loaded models, their frameworks'
objects: tens of thousands) is walked by every full collection; unfrozen, such a pass held an
instance's event loop 60-270 ms (`podium serve` of the `recommend` pipeline at c=32) and the
gateway's ~40 ms (`bench/overload_xgb.py`), so every request arriving meanwhile, a refusal too,
waited for it; frozen, 2-3 ms. Frozen objects are still freed by reference counting; only
cycles among them are never collected.
"""

from __future__ import annotations

import gc


def freeze() -> int:
    """Collect once, then freeze what is left; how many objects are frozen now."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
