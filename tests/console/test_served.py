"""The console's files: served by the control API at /console without a key (they hold no
data), shipped in the package, and asking nothing from another origin."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient

from podium.console import STATIC
from podium.control.api import create_app
from tests.support.control_api import Env

KEY = "console-key-0123456789"


def test_console_files_are_open_and_the_data_needs_the_key(tmp_path: Path) -> None:
    env = Env(tmp_path)
    try:
        client = TestClient(create_app(env.plane, api_key=KEY))
        r = client.get("/console", follow_redirects=False)
        assert r.status_code in (307, 308) and r.headers["location"] == "/console/"
        page = client.get("/console/")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert '<script src="console.js">' in page.text
        for name, kind in (("console.js", "javascript"), ("views.js", "javascript"),
                           ("related.js", "javascript"), ("console.css", "text/css")):
            r = client.get(f"/console/{name}")
            assert r.status_code == 200 and kind in r.headers["content-type"], name
        # the data the page reads stays behind the admin key
        assert client.get("/v1/status").status_code == 401
        assert client.get("/v1/status", headers={"Authorization": f"Bearer {KEY}"}
                          ).status_code == 200
        assert client.get("/console/../v1/status").status_code in (401, 404)
    finally:
        env.store.close()


def test_no_request_leaves_the_origin() -> None:
    """No CDN font, script or stylesheet: every URL the files name is relative."""
    for path in STATIC.iterdir():
        text = path.read_text()
        assert not re.search(r"(src|href)=\"(https?:)?//", text), path.name
        assert "@import" not in text and "url(http" not in text, path.name
        assert not re.search(r"fetch\(\s*[\"'`]https?:", text), path.name
