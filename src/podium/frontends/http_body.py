"""Reading a request body, size-capped whether the size is declared or only sent."""

from __future__ import annotations

from starlette.requests import Request

from podium.errors import PayloadTooLarge

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The raw body, refusing more than `max_bytes` (declared or actually sent)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() \
            and int(declared) > max_bytes:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the {max_bytes}-byte "
                              "limit (--max-body-bytes)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"request body exceeds the {max_bytes}-byte limit "
                                  "(--max-body-bytes)")
        chunks.append(chunk)
    return b"".join(chunks)
