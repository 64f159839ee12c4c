"""``make lab`` — the README's first command — starts a server a learner can reach.

Jupyter refuses to run as root without ``--allow-root`` and tries to open a browser that a
headless server does not have; the Makefile passes ``--allow-root`` only to root and
``--no-browser`` only without a display. The real run happens in a copy of the working tree
(what a fresh clone holds) with a ready virtual environment, as whichever user runs the tests
(root in CI): it must print the URL with its token and answer HTTP 200 on localhost.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
URL = re.compile(r"(http://(?:127\.0\.0\.1|localhost):(\d+)/lab[^?\s]*\?token=[0-9a-f]+)")


def dry_run(**variables: str) -> str:
    """The commands ``make lab`` would run, with Makefile variables set."""
    args = [f"{k}={v}" for k, v in variables.items()]
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    out = subprocess.run(["make", "-s", "-n", "-C", str(ROOT), "lab", *args], env=env, capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if "-m jupyterlab" in line][0]


needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


@needs_make
def test_allow_root_only_for_root():
    assert "--allow-root" in dry_run(USER_ID="0")
    assert "--allow-root" not in dry_run(USER_ID="1000")


@needs_make
def test_no_browser_without_a_display():
    assert "--no-browser" in dry_run(UNAME="Linux")
    assert "--no-browser" not in dry_run(UNAME="Linux", DISPLAY=":0")
    assert "--no-browser" not in dry_run(UNAME="Darwin")  # macOS opens browsers without $DISPLAY


@needs_make
def test_port_and_extra_arguments_override():
    line = dry_run(PORT="9123", LAB_ARGS="--ip=0.0.0.0")
    assert "--ServerApp.port=9123" in line
    assert line.rstrip().endswith("--ip=0.0.0.0")  # last, so it wins over the Makefile's defaults


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fresh_checkout(dest: Path) -> Path:
    """The tracked and untracked-but-not-ignored files of this repository (a fresh clone)."""
    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, text=True, check=True,
    ).stdout.split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def ready_venv(repo: Path) -> None:
    """``repo/.venv`` with this interpreter's packages and ``repo``'s adam8lib, marked installed."""
    venv = repo / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    paths = [str(repo)] + [p for p in sys.path if p and Path(p).is_dir() and Path(p).resolve() != ROOT]
    (site / "_course.pth").write_text("\n".join(paths) + "\n")
    (venv / ".installed").touch()  # newer than pyproject.toml: make skips the pip install


@needs_make
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_make_lab_answers_on_localhost(tmp_path):
    repo = fresh_checkout(tmp_path / "adam8")
    ready_venv(repo)
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "TRITON_INTERPRET")}
    env.update(JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "ws"))
    log = tmp_path / "lab.log"
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(["make", "lab", f"PORT={free_port()}"], cwd=repo, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = None
        while time.monotonic() - started < 120:
            assert proc.poll() is None, f"make lab exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            found = URL.search(log.read_text())
            if found:
                url = found.group(1)
                try:
                    with urllib.request.urlopen(url, timeout=10) as response:
                        status = response.status
                    break
                except OSError:
                    pass
            time.sleep(1)
        assert url, f"no http://127.0.0.1:PORT/lab?token=... line within 2 minutes:\n{log.read_text()[-3000:]}"
        assert status == 200, status
        assert time.monotonic() - started < 120
        text = log.read_text()
        assert ("--allow-root" in text) == (os.geteuid() == 0)
        assert "--no-browser" in text  # no display here
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
