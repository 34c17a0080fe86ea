"""Headless Chromium (Debian's, installed by scripts/browser.sh) driven by Playwright."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
    """A fresh Chromium context (its own profile directory); skipped without chromium."""
    if not shutil.which(CHROMIUM):
        if os.environ.get("CI"):  # CI installs it (scripts/test.sh): a skip would hide a gap
            pytest.fail("no /usr/bin/chromium although CI runs scripts/browser.sh")
        pytest.skip("no /usr/bin/chromium: run scripts/browser.sh")
    from playwright import sync_api  # a test dependency (pyproject's `test` extra)
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, args=ARGS, headless=True,
            viewport={"width": 1280, "height": 860})
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def shoot(tmp_path: Path) -> Callable[..., None]:
    """`shoot(page, name, full_page=False)`: a screenshot into PODIUM_CONSOLE_SHOTS (docs/img
    to refresh the docs' pictures) or the test's own folder, cut to 64 colours (small PNGs)."""
    folder = Path(os.environ.get("PODIUM_CONSOLE_SHOTS") or tmp_path / "shots")
    folder.mkdir(parents=True, exist_ok=True)

    def take(page: Any, name: str, *, full_page: bool = False) -> None:
        path = folder / f"{name}.png"
        page.screenshot(path=str(path), full_page=full_page)
        try:
            from PIL import Image
        except ImportError:
            return
        with Image.open(path) as image:
            image.convert("RGB").quantize(colors=64).save(path, optimize=True)

    return take
