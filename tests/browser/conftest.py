"""The real-browser tests run only from ``make browser-test`` (``ADAM8_BROWSER=1``).

They need Playwright for Python (``pip install -e .[browser]``) and a system Chromium
(Debian: ``apt-get install chromium``); Playwright's own browser download is not used.
Screenshots go to ``browser-artifacts/`` (or ``$ADAM8_BROWSER_ARTIFACTS``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

if os.environ.get("ADAM8_BROWSER") != "1":
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def artifacts() -> Path:
    path = Path(os.environ.get("ADAM8_BROWSER_ARTIFACTS", ROOT / "browser-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    for old in [*path.glob("*.png"), path / "times.txt"]:
        old.unlink(missing_ok=True)
    return path


@pytest.fixture(scope="session")
def course_copy(tmp_path_factory) -> Path:
    """A copy of notebooks/ and exercises/: running them in the browser must not touch the repo."""
    root = tmp_path_factory.mktemp("course")
    for folder in ("notebooks", "exercises"):
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    return root


@pytest.fixture(scope="session")
def lab(course_copy, tmp_path_factory):
    from adam8lib.course.outputs import execution_env

    from .lab import LabServer

    with LabServer(course_copy, tmp_path_factory.mktemp("lab-home"), env=execution_env()) as server:
        yield server


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    from .lab import find_chromium

    exe = find_chromium()
    if exe is None:
        pytest.fail("no system Chromium: install Debian's `chromium` (make browser-test does it as root) or set $CHROMIUM")
    with sync_playwright() as p:
        # --no-sandbox: Chromium's sandbox cannot start as root (containers, CI)
        b = p.chromium.launch(executable_path=exe, headless=True, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture
def page(browser, lab):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60_000)
    yield page
    context.close()
    lab.shutdown_kernels()  # one lesson's kernel (and its memory) at a time
