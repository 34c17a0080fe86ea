"""Just enough protobuf wire format to read a message's first two string fields cheaply.

Model-scoped KServe messages keep the model name in field 1 and the version in field 2; reading
them this way skips decoding (and copying) the tensors a ModelInferRequest carries.
"""

from __future__ import annotations

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


def peek_name_version(data: bytes) -> tuple[str, str | None]:
    """(field 1, field 2 or None when empty) of a serialized message."""
    fields: dict[int, str] = {}
    pos = 0
    while pos < len(data) and len(fields) < 2:
        key, pos = _varint(data, pos)
        number, kind = key >> 3, key & 7
        if kind == _VARINT:
            _, pos = _varint(data, pos)
        elif kind == _I64:
            pos += 8
        elif kind == _I32:
            pos += 4
        elif kind == _LEN:
            size, pos = _varint(data, pos)
            if number in (1, 2):
                fields[number] = data[pos:pos + size].decode("utf-8", "replace")
            pos += size
        else:  # groups are not used by these messages
            break
    return fields.get(1, ""), fields.get(2) or None


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
