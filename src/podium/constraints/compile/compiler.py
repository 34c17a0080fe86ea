"""Compiling constraint specs against one tokenizer, with a cache shared by all requests."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

from podium.constraints.compile.base import Constraint
from podium.constraints.compile.vocab import TokenizerInfo


class ConstraintCompiler:
    """Turns normalized spec JSON into compiled constraints; the last ``capacity`` are kept.

    Keyed by the spec's JSON text, so a request repeating a 10,000-title ``choice`` pays
    one dict lookup, not a tokenization.
    """

    def __init__(self, tok: TokenizerInfo, capacity: int = 256) -> None:
        self.tok = tok
        self.capacity = capacity
        self._cache: OrderedDict[str, Constraint] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, spec: str | dict[str, Any]) -> Constraint:
        """The compiled constraint for ``spec`` (normalized JSON text or dict)."""
        key = spec if isinstance(spec, str) else json.dumps(spec, sort_keys=True)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        constraint = self._compile(json.loads(key) if isinstance(spec, str) else spec)
        with self._lock:
            self._cache[key] = constraint
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
        return constraint

    def _compile(self, spec: dict[str, Any]) -> Constraint:
        from podium.constraints.spec.admission import validate_constraint
        from podium.constraints.spec.registry import constraint_type, ensure_plugins_loaded

        ensure_plugins_loaded()
        # the spec came through the engine: validate again rather than trust its sender
        normalized = validate_constraint(spec)
        ct = constraint_type(normalized["type"])
        assert ct is not None
        return ct.compile(normalized, self.tok)
