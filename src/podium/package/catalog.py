"""A package's constraint catalog: the strings its requests constrain to, known ahead of them.

A member-scale workload sends every request its own candidates, drawn from one catalog (the
titles a service offers). Tokenizing a candidate is most of what compiling its constraint costs
(p99 15-17 ms for 20-500 titles never seen, 4 ms once they are known: docs/benchmarks.md), so a
package may name its catalog (`constraint_catalog` in podium.json): a UTF-8 text file, one
string a line. The instance tokenizes it when it boots, before it reports ready, and a
request's `choice` or `distinct_items` over catalog strings then compiles without the tokenizer.
Strings outside the catalog still work; they are tokenized when a request first names them.
"""

from __future__ import annotations

from pathlib import Path

from podium.errors import PackageError
from podium.package.paths import read_small_file

FIELD = "constraint_catalog"
MAX_CATALOG_BYTES = 64 * 1024 * 1024
"""The largest catalog file (64 MiB); its strings cost ~300 bytes each in each process that
compiles (two tokenized spellings and the text)."""
MAX_CATALOG_STRINGS = 1_000_000
"""The most strings a catalog holds."""
MAX_STRING_CHARS = 4096
"""The longest catalog string (a title, not a document)."""


def read_catalog(path: Path, root: Path) -> list[str]:
    """The distinct strings of the catalog file `path` (inside the package `root`), in file
    order; blank lines are skipped, a line's end (LF or CRLF) is not part of its string.
    Anything else wrong is a PackageError naming the field, the line and the fix."""
    where = f"{FIELD}={path.name!r}"
    raw = read_small_file(path, root, MAX_CATALOG_BYTES, f"the {FIELD} file")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise PackageError(f"{where}: line {line} is not UTF-8 (byte 0x{raw[exc.start]:02x}); "
                           "save the catalog as UTF-8", param=FIELD) from None
    strings: dict[str, None] = {}
    for number, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        if len(line) > MAX_STRING_CHARS:
            raise PackageError(f"{where}: line {number} is {len(line)} characters, over the "
                               f"{MAX_STRING_CHARS}-character cap; a catalog holds one short "
                               "string a line", param=FIELD)
        if "\0" in line:
            raise PackageError(f"{where}: line {number} holds a NUL character; remove it",
                               param=FIELD)
        strings[line] = None
        if len(strings) > MAX_CATALOG_STRINGS:
            raise PackageError(f"{where}: more than {MAX_CATALOG_STRINGS:,} strings; split the "
                               "catalog or name only what requests choose from", param=FIELD)
    if not strings:
        raise PackageError(f"{where}: the file holds no string; write one a line, or remove "
                           f"{FIELD} from podium.json", param=FIELD)
    return list(strings)
