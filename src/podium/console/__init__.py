"""The console: a web page served by the control API at /console (plain HTML, one script and
one stylesheet shipped in this package; no build step, no request leaves the page's origin).

The page reads the API's JSON routes and its /metrics text, and calls the admin routes with
the key the operator types into it; this module only serves the files.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"
PREFIX = "/console"


def is_console_path(path: str) -> bool:
    """Whether `path` is one of the console's files (open: they hold no data, the API does)."""
    return path == PREFIX or path.startswith(PREFIX + "/")


def mount_console(app: FastAPI) -> None:
    """Serve the console's files at /console/ (and /console redirects there)."""

    @app.get(PREFIX, include_in_schema=False)
    def console_root() -> RedirectResponse:
        return RedirectResponse(PREFIX + "/")

    app.mount(PREFIX + "/", StaticFiles(directory=STATIC, html=True), name="console")
