"""The compact, compiled form of a constraint: flat arrays the engine adopts as they are.

A spec is compiled once, off the engine (in the frontend's compile pool), to a
:class:`CompiledForm`: the token table in CSR arrays, an edge guard per edge, and for
``distinct_items`` the item paths and per-node item counts a request starts from. The form
serializes to one buffer (a JSON header plus 64-byte-aligned raw arrays), so the engine process
reads a file and takes array views: no tokenizer, no trie walk, no validation.

Every built-in constraint *is* its form (:class:`~podium.constraints.compile.base.FormConstraint`:
``choice``, ``regex``, ``distinct_items``), and a plugin that is a plain
:class:`~podium.constraints.compile.base.TableConstraint` lowers to one; a plugin with its own
Python state does not (its ``lower`` returns None) and keeps the per-constraint object path.
A constraint lowers itself (``Constraint.lower``): nothing here reads its insides.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # the table imports numba; this module is read by the engine's
    # processor, which must not load it at import (docs/constraints.md)
    from podium.constraints.compile.table import TokenTable

TABLE, DISTINCT = 0, 1
"""Form kinds: a plain token table; a ``distinct_items`` table with guards and item paths."""

_MAGIC = b"PODCF001"
_ALIGN = 64
FIELDS: dict[str, type] = {
    "offsets": np.int32, "tokens": np.int32, "targets": np.int32, "accepting": np.bool_,
    "guard": np.int8, "item_of_node": np.int32, "path_offsets": np.int32,
    "path_nodes": np.int32, "base_alive": np.int32,
}


@dataclass(eq=False)
class CompiledForm:
    """One compiled constraint, ready for the engine's batch (``engine.batch.ConstraintBatch``)."""

    key: str
    """Content hash of (tokenizer, normalized spec): identical specs share one form."""
    kind: int
    """TABLE or DISTINCT."""
    arrays: dict[str, np.ndarray]
    """The fields of ``FIELDS``, C-contiguous, writable (numba wants them so)."""
    start: int
    after_item: int = -1
    min_items: int = 0
    max_items: int = 0
    vocab_size: int = 0
    eos_token_ids: tuple[int, ...] = ()
    compile_seconds: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_states(self) -> int:
        return len(self.arrays["offsets"]) - 1

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def to_bytes(self) -> bytes:
        """The whole form as one buffer (see :func:`from_buffer`)."""
        header: dict[str, Any] = {
            "key": self.key, "kind": self.kind, "start": self.start,
            "after_item": self.after_item, "min_items": self.min_items,
            "max_items": self.max_items, "vocab_size": self.vocab_size,
            "eos_token_ids": list(self.eos_token_ids),
            "compile_seconds": self.compile_seconds, "meta": self.meta, "arrays": {},
        }
        blobs, offset = [], 0
        for name in FIELDS:
            data = np.ascontiguousarray(self.arrays[name]).tobytes()
            header["arrays"][name] = [offset, len(self.arrays[name])]
            pad = -len(data) % _ALIGN
            blobs.append(data + b"\0" * pad)
            offset += len(data) + pad
        head = json.dumps(header).encode()
        head += b" " * (-(len(head) + 16) % _ALIGN)
        return b"".join([_MAGIC, struct.pack("<Q", len(head)), head, *blobs])


def from_buffer(buf: bytearray | memoryview) -> CompiledForm:
    """Views into ``buf`` (kept alive by them); raises ValueError if it is not a form."""
    view = memoryview(buf)
    if bytes(view[:8]) != _MAGIC:
        raise ValueError("not a compiled constraint (bad magic)")
    (head_len,) = struct.unpack("<Q", view[8:16])
    header = json.loads(bytes(view[16: 16 + head_len]))
    base = 16 + head_len
    arrays = {}
    for name, dtype in FIELDS.items():
        offset, count = header["arrays"][name]
        arrays[name] = np.frombuffer(view, dtype=dtype, count=count, offset=base + offset)
    return CompiledForm(
        key=header["key"], kind=header["kind"], arrays=arrays, start=header["start"],
        after_item=header["after_item"], min_items=header["min_items"],
        max_items=header["max_items"], vocab_size=header["vocab_size"],
        eos_token_ids=tuple(header["eos_token_ids"]),
        compile_seconds=header["compile_seconds"], meta=header["meta"])


def form_arrays(**fields: np.ndarray) -> dict[str, np.ndarray]:
    """The ``FIELDS`` of a form in their dtypes (C-contiguous); a field not given is empty."""
    offsets = fields["offsets"]
    if offsets.size and int(offsets[-1]) >= 2**31:
        raise ValueError("constraint too large: more than 2**31 token edges")
    return {name: np.ascontiguousarray(fields.get(name, np.zeros(0)), dtype=dtype)
            for name, dtype in FIELDS.items()}


def table_form(table: TokenTable, *, key: str = "", vocab_size: int | None = None,
               eos_token_ids: tuple[int, ...] = ()) -> CompiledForm:
    """The compiled form of a plain token table (no guards, no per-request state)."""
    t = table
    arrays = form_arrays(offsets=t.offsets, tokens=t.tokens, targets=t.targets,
                         accepting=t.accepting, guard=np.zeros(t.num_edges, dtype=np.int8))
    return CompiledForm(key=key, kind=TABLE, arrays=arrays, start=t.start,
                        vocab_size=t.vocab_size if vocab_size is None else vocab_size,
                        eos_token_ids=tuple(eos_token_ids))
