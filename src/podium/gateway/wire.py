"""The model and version a KServe gRPC request names; a request that is no valid message is refused.

Every model-scoped message of the service keeps the model name in field 1 and the version in
field 2. The request is parsed whole by protobuf's C parser (upb) before it is routed: that is
faster than reading the two fields in Python (2.5 µs against 5 µs for a small ModelInferRequest,
about 40 µs more per MiB of tensors) and means a truncated or garbled message is answered
INVALID_ARGUMENT at the gateway instead of reaching an instance. upb says only that a message
did not parse; a walk of the message's top-level wire format then says where.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError

from podium.errors import InvalidArgument

_VARINT, _I64, _LEN, _START_GROUP, _END_GROUP, _I32 = 0, 1, 2, 3, 4, 5
_MAX_VARINT_BYTES = 10  # 64 bits, 7 per byte


def read_name_version(cls: Any, data: bytes) -> tuple[str, str | None]:
    """(field 1, field 2 or None when empty) of a serialized `cls` message.

    Raises `InvalidArgument` ("the request is not a valid ModelInferRequest: ...") when `data`
    does not parse as one; never anything else.
    """
    try:
        message = cls.FromString(data)
    except DecodeError:
        raise InvalidArgument(f"the request is not a valid {cls.DESCRIPTOR.name}: "
                              f"{why_malformed(data)}") from None
    fields = cls.DESCRIPTOR.fields_by_number
    return getattr(message, fields[1].name), getattr(message, fields[2].name) or None


def why_malformed(data: bytes) -> str:
    """Where the top level of a serialized message breaks the wire format, in words."""
    pos = 0
    size = len(data)
    try:
        while pos < size:
            start = pos
            key, pos = _varint(data, pos, "a field key")
            number, kind = key >> 3, key & 7
            if number == 0:
                return f"field number 0 at byte {start} (protobuf fields start at 1)"
            if kind == _VARINT:
                _, pos = _varint(data, pos, f"field {number}'s value")
            elif kind in (_I64, _I32):
                pos += 8 if kind == _I64 else 4
            elif kind == _LEN:
                length, pos = _varint(data, pos, f"field {number}'s length")
                if pos + length > size:
                    return (f"field {number} declares {length} bytes at byte {pos} but the "
                            f"message ends {size - pos} bytes later (truncated?)")
                if number in (1, 2) and not _is_utf8(data[pos:pos + length]):
                    name = "the model name" if number == 1 else "the version"
                    return f"field {number} ({name}) is not UTF-8"
                pos += length
            elif kind in (_START_GROUP, _END_GROUP):
                return f"field {number} at byte {start} is a group; KServe messages have none"
            else:
                return f"wire type {kind} at byte {start} is not a protobuf wire type"
            if pos > size:
                return (f"field {number} at byte {start} runs past the end of the "
                        f"{size}-byte message (truncated?)")
    except _Malformed as exc:
        return str(exc)
    return ("its top level is well formed, so a nested message (a tensor, a parameter) is "
            "malformed or a string in it is not UTF-8")


class _Malformed(ValueError):
    pass


def _varint(data: bytes, pos: int, what: str) -> tuple[int, int]:
    result = shift = 0
    for i in range(pos, min(pos + _MAX_VARINT_BYTES, len(data))):
        byte = data[i]
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, i + 1
        shift += 7
    if pos + _MAX_VARINT_BYTES <= len(data):
        raise _Malformed(f"{what} at byte {pos} is a varint longer than {_MAX_VARINT_BYTES} "
                         "bytes")
    raise _Malformed(f"{what} at byte {pos} is a varint cut off by the end of the message "
                     "(truncated?)")


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
