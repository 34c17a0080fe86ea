"""The constraint API: a state machine over generated tokens, stepped for many requests at once.

Every compiled constraint is a :class:`Constraint`. One compiled instance is shared by every
request that asks for the same constraint; each request is a *handle* (a stable small integer,
unchanged when the engine moves the request inside its batch) with an integer state that the
batch processor stores. Every method takes arrays of handles and states, so the processor calls
each distinct constraint once per step, never once per request.

Two kinds, and one step path each:

- :class:`FormConstraint`, the built-ins (``choice``, ``regex``, ``distinct_items``): the
  constraint is its compiled form (:class:`~podium.constraints.compile.form.CompiledForm`),
  stepped by the batch kernels (:mod:`podium.constraints.kernels`), in the engine's batch and
  when its methods are called directly alike;
- a plugin's own subclass (the object path): the batch calls its methods once per distinct
  constraint per step. A plugin whose state is one integer needs only :class:`TableConstraint`
  (which lowers to a form, and so takes the built-ins' path); one with more state per request
  (e.g. which items are already used) keeps it in its own arrays indexed by handle,
  initialized in ``start`` and read in ``allowed``/``advance``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace

import numpy as np
from numba import typed

from podium.constraints import kernels
from podium.constraints.compile.form import CompiledForm, table_form
from podium.constraints.compile.table import DEAD, TokenTable, as_i64


class Constraint(ABC):
    """A compiled constraint: the allowed tokens of each state, and how tokens move states.

    End-of-sequence is not part of the token sets: the processor allows the model's EOS
    tokens wherever ``is_accepting`` is true, and only EOS when no token is allowed.
    """

    @abstractmethod
    def start(self, handles: np.ndarray) -> np.ndarray:
        """Reset per-request state of ``handles``; return their initial states (int64)."""

    @abstractmethod
    def advance(self, handles: np.ndarray, states: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """States after each request takes its token; ``DEAD`` (-1) when the token was not
        allowed. Called with each request's tokens in order, one token per request per call."""

    @abstractmethod
    def allowed(self, handles: np.ndarray, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Allowed tokens, flattened: ``(position into handles, token id)`` pairs."""

    @abstractmethod
    def is_accepting(self, handles: np.ndarray, states: np.ndarray) -> np.ndarray:
        """Whether each request may end here (bool)."""

    def release(self, handles: np.ndarray) -> None:  # noqa: B027 - optional hook
        """The requests left the batch; drop any per-request state (optional)."""

    def lower(self, *, key: str, vocab_size: int,
              eos_token_ids: tuple[int, ...]) -> CompiledForm | None:
        """This constraint's compiled form, keyed ``key``; None (the default) keeps it on the
        object path: the batch calls its methods above."""
        return None


class TableConstraint(Constraint):
    """A constraint whose whole state is one integer: a :class:`TokenTable`."""

    def __init__(self, table: TokenTable) -> None:
        self.table = table

    def start(self, handles: np.ndarray) -> np.ndarray:
        return np.full(len(handles), self.table.start, dtype=np.int64)

    def advance(self, handles: np.ndarray, states: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        return self.table.step(states, tokens)

    def allowed(self, handles: np.ndarray, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.table.tokens_of(states)

    def is_accepting(self, handles: np.ndarray, states: np.ndarray) -> np.ndarray:
        return self.table.is_accepting(states)

    def lower(self, *, key: str, vocab_size: int,
              eos_token_ids: tuple[int, ...]) -> CompiledForm | None:
        """The table's form, unless a subclass changed how it steps (then the object path)."""
        cls = type(self)
        own = (cls.advance, cls.allowed, cls.is_accepting, cls.start)
        base = (TableConstraint.advance, TableConstraint.allowed, TableConstraint.is_accepting,
                TableConstraint.start)
        if own != base:
            return None
        return table_form(self.table, key=key, vocab_size=vocab_size,
                          eos_token_ids=eos_token_ids)


_NO_EOS = np.zeros(0, dtype=np.int64)  # allowed() lists a state's own tokens only
_NO_ALIVE = np.zeros(0, dtype=np.int32)


class FormConstraint(Constraint):
    """A constraint that is its compiled form: the built-in types.

    ``lower`` hands the form over as it is (its arrays shared, not copied). The methods step
    the same form in the same kernels as the engine's batch (one handle is one slot), so a
    built-in has one step implementation; their per-handle arrays are made on first call only,
    a compile never pays for them.
    """

    def __init__(self, form: CompiledForm) -> None:
        self.form = form
        self._slots: _Slots | None = None

    def lower(self, *, key: str, vocab_size: int,
              eos_token_ids: tuple[int, ...]) -> CompiledForm:
        return replace(self.form, key=key, vocab_size=vocab_size,
                       eos_token_ids=tuple(eos_token_ids))

    def _at(self, handles: np.ndarray) -> tuple[_Slots, np.ndarray]:
        h = as_i64(handles)
        if self._slots is None:
            self._slots = _Slots(self.form)
        self._slots.ensure(int(h.max()) + 1 if len(h) else 0)
        return self._slots, h

    def start(self, handles: np.ndarray) -> np.ndarray:
        s, h = self._at(handles)
        kernels.restart(h, s.form, s.state, s.count, s.consumed, s.last_token, s.meta,
                        s.lists["base_alive"], s.alive)
        return s.state[h]

    def advance(self, handles: np.ndarray, states: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        s, h = self._at(handles)
        s.state[h] = states
        li = s.lists
        kernels.advance(h, as_i64(tokens), s.form, s.state, s.count, s.consumed, s.last_token,
                        s.meta, li["offsets"], li["tokens"], li["targets"], li["guard"],
                        li["item_of_node"], li["path_offsets"], li["path_nodes"], s.alive)
        return s.state[h]

    def allowed(self, handles: np.ndarray, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s, h = self._at(handles)
        s.state[h] = states
        li = s.lists
        return kernels.allowed(h, s.form, s.state, s.count, s.meta, li["offsets"], li["tokens"],
                               li["targets"], li["accepting"], li["guard"], s.alive, _NO_EOS)

    def is_accepting(self, handles: np.ndarray, states: np.ndarray) -> np.ndarray:
        states = as_i64(states)
        out = np.zeros(len(states), dtype=bool)
        live = states != DEAD
        out[live] = self.form.arrays["accepting"][states[live]]
        return out


class _Slots:
    """A :class:`FormConstraint`'s requests as the kernels see a batch: one slot a handle,
    every slot holding form 0."""

    def __init__(self, form: CompiledForm) -> None:
        self.lists = {name: typed.List.empty_list(t) for name, t in kernels.LIST_TYPES.items()}
        for name, lst in self.lists.items():
            lst.append(form.arrays[name])
        self.meta = np.array([kernels.meta_row(form)], dtype=np.int64)
        self._base = form.arrays["base_alive"] if form.kind == kernels.DISTINCT_KIND else None
        self.alive = typed.List.empty_list(kernels.LIST_TYPES["base_alive"])
        self.form = self.state = self.count = self.consumed = self.last_token = _NO_EOS

    def ensure(self, size: int) -> None:
        old = len(self.form)
        if size <= old:
            return
        size = max(size, 2 * old, 8)

        def grown(a: np.ndarray, fill: int) -> np.ndarray:
            new = np.full(size, fill, dtype=np.int64)
            new[:old] = a
            return new

        self.form = grown(self.form, 0)
        self.state = grown(self.state, DEAD)
        self.count, self.consumed = grown(self.count, 0), grown(self.consumed, 0)
        self.last_token = grown(self.last_token, -1)
        for _ in range(old, size):
            self.alive.append(self._base.copy() if self._base is not None else _NO_ALIVE)


__all__ = ["DEAD", "Constraint", "FormConstraint", "TableConstraint"]
