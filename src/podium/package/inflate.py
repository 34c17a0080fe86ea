"""The decompressed bytes of an archive file, refused while streaming past a ratio or size cap.

A gzip bomb (a small file that inflates to gigabytes) is stopped the moment its output passes
`max_ratio` times the file's size (beyond a small `ratio_floor_bytes` any archive may reach),
before the rest is decompressed or written anywhere. A plain (uncompressed) tar passes through.
"""

from __future__ import annotations

import io
import zlib
from pathlib import Path
from typing import BinaryIO

from podium.errors import UnsafeArchive

GZIP_MAGIC = b"\x1f\x8b"
_OTHER_COMPRESSIONS = {b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}
_CHUNK = 1 << 16


class BoundedInflate(io.RawIOBase):
    """A read-only stream of `file`'s decompressed bytes that raises UnsafeArchive past a cap."""

    def __init__(self, file: BinaryIO, archive: Path, compressed_size: int, *, max_ratio: float,
                 ratio_floor_bytes: int, max_bytes: int) -> None:
        super().__init__()
        self._file = file
        self._archive = archive
        self._ratio = max_ratio
        self._limit = min(max_bytes, max(ratio_floor_bytes, int(max_ratio * compressed_size)))
        self._ratio_bound = self._limit < max_bytes
        self._produced = 0
        head = file.read(6)
        for magic, name in _OTHER_COMPRESSIONS.items():
            if head.startswith(magic):
                raise UnsafeArchive(f"{archive}: compressed with {name}; a package archive is "
                                    "gzip (.tar.gz, as `podium package` writes) or a plain .tar")
        self._inflater = (zlib.decompressobj(wbits=31) if head.startswith(GZIP_MAGIC)
                          else None)
        self._pending = head

    @property
    def produced(self) -> int:
        """Decompressed bytes handed out so far."""
        return self._produced

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self._next(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def _next(self, size: int) -> bytes:
        while True:
            if not self._pending:
                self._pending = self._file.read(_CHUNK)
            if self._inflater is None:
                data, self._pending = self._pending[:size], self._pending[size:]
                return self._count(data)
            if not self._pending:
                if not self._inflater.eof:
                    raise UnsafeArchive(f"{self._archive}: truncated (the gzip data ends after "
                                        f"{self._produced} bytes); copy the archive again")
                return b""
            if self._inflater.eof:  # another gzip member follows, as `cat a.gz b.gz` makes
                if not self._pending.startswith(GZIP_MAGIC):
                    self._pending = b""  # trailing padding, ignored as gzip itself does
                    continue
                self._inflater = zlib.decompressobj(wbits=31)
            try:
                data = self._inflater.decompress(self._pending, size)
            except zlib.error as exc:
                raise UnsafeArchive(f"{self._archive}: corrupt gzip data ({exc}); copy the "
                                    "archive again") from None
            self._pending = self._inflater.unconsumed_tail or self._inflater.unused_data
            if data:
                return self._count(data)

    def _count(self, data: bytes) -> bytes:
        self._produced += len(data)
        if self._produced > self._limit:
            if self._ratio_bound:
                raise UnsafeArchive(
                    f"{self._archive}: inflates to more than {self._limit} bytes, over "
                    f"{self._ratio:g} times its compressed size (a decompression bomb?); "
                    "packages this compressible are refused")
            raise UnsafeArchive(f"{self._archive}: unpacks to more than {self._limit} bytes")
        return data
