"""The `podium top` table."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from podium.top.stats import AdapterRow, Row

COLUMNS = (
    "instance",
    "ready",
    "req/s",
    "gen tok/s",
    "prompt tok/s",
    "TTFT p50",
    "TTFT p99",
    "KV cache",
    "running",
    "waiting",
)


def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def _ready(ready: bool | None) -> Text:
    if ready is None:
        return Text("?", style="dim")
    return Text("yes", style="green") if ready else Text("no", style="yellow")


def cells(row: Row) -> list[str | Text]:
    """The cells of one line, after the instance name."""
    return [
        _ready(row.ready),
        _num(row.requests_per_s, "{:.2f}"),
        _num(row.generated_per_s),
        _num(row.prompt_per_s),
        _ms(row.ttft_p50_s),
        _ms(row.ttft_p99_s),
        _num(None if row.kv_cache_perc is None else row.kv_cache_perc * 100, "{:.1f}%"),
        _num(row.running, "{:.0f}"),
        _num(row.waiting, "{:.0f}"),
    ]


def table(
    rows: list[tuple[str, Row | AdapterRow | str]],
    total: Row | None,
    interval: float,
    title_extra: str = "",
) -> Table:
    """A table with one line per instance (a string row is an error; an adapter row, under its
    instance, shows the requests of one LoRA adapter) and an optional total."""
    t = Table(title=f"podium top - every {interval:g}s{title_extra}", title_justify="left")
    for i, name in enumerate(COLUMNS):
        t.add_column(name, justify="left" if i == 0 else "right", no_wrap=i == 0)
    for name, row in rows:
        if isinstance(row, AdapterRow):
            t.add_row(Text(name, style="dim"), "", _num(row.requests_per_s, "{:.2f}"), *[""] * 7)
        elif isinstance(row, str):
            t.add_row(name, Text("down", style="red"), Text(row, style="red"), *[""] * 7)
        else:
            t.add_row(name, *cells(row))
    if total is not None:
        t.add_section()
        t.add_row(Text("total", style="bold"), *cells(total))
    return t
