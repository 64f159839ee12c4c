"""JupyterLab in a real Chromium, driven by Playwright: the pieces of the browser tests.

* :class:`LabServer` starts ``python -m jupyterlab`` (this interpreter) on a free localhost port
  with a throw-away root, settings, workspaces, runtime and data dir; its ``python3`` kernel is
  this interpreter. Cells are not virtualised (``windowingMode: none``) so every output is in the
  page, and the news/update pop-ups are off (no network).
* :func:`run_notebook` opens a notebook, runs **Run ▸ Run All Cells** from the menu bar, waits until
  no cell is queued and the kernel is idle, saves with Ctrl+S, and returns what the page and the
  saved file show (:class:`Seen`).
* :func:`expected` counts plots and widgets in a stored notebook; :func:`problems` compares.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
PLOT_MIMES = ("image/png", "image/svg+xml", "image/jpeg")
CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The system Chromium (Debian's ``chromium`` package), or ``$CHROMIUM``."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    for name in CHROMIUM_CANDIDATES:
        if path := shutil.which(name):
            return path
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def share_dirs() -> list[Path]:
    """``<prefix>/share/jupyter`` of every environment on ``sys.path``.

    Lab extensions (ipywidgets' widget renderer) live there; a virtual environment that reuses
    another one's packages through a ``.pth`` file would not otherwise find them.
    """
    dirs = []
    for entry in sys.path:
        p = Path(entry)
        if p.name == "site-packages" and (share := p.parents[2] / "share" / "jupyter").is_dir() and share not in dirs:
            dirs.append(share)
    return dirs


SETTINGS = {
    # every cell stays in the DOM (JupyterLab 4 virtualises long notebooks by default)
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    # no "news" / "check for updates" pop-ups (and no network requests for them)
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
}


class LabServer:
    """``python -m jupyterlab`` on a free port in ``home`` (a scratch dir); a context manager."""

    def __init__(self, root: Path, home: Path, env: dict[str, str] | None = None):
        self.root, self.home = Path(root), Path(home)
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = dict(env or os.environ)
        self.proc: subprocess.Popen | None = None
        self.log = self.home / "lab.log"

    def _prepare(self) -> dict[str, str]:
        dirs = {n: self.home / n for n in ("settings", "workspaces", "runtime", "data", "config")}
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        for rel, value in SETTINGS.items():
            (dirs["settings"] / rel).parent.mkdir(parents=True, exist_ok=True)
            (dirs["settings"] / rel).write_text(json.dumps(value))
        # python3 = this interpreter, whatever kernelspecs the machine has elsewhere
        spec = dirs["data"] / "kernels" / "python3"
        spec.mkdir(parents=True, exist_ok=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (ipykernel)", "language": "python",
        }))
        env = dict(self.env)
        env.update(
            JUPYTERLAB_SETTINGS_DIR=str(dirs["settings"]), JUPYTERLAB_WORKSPACES_DIR=str(dirs["workspaces"]),
            JUPYTER_RUNTIME_DIR=str(dirs["runtime"]), JUPYTER_DATA_DIR=str(dirs["data"]),
            JUPYTER_CONFIG_DIR=str(dirs["config"]),
        )
        env["JUPYTER_PATH"] = os.pathsep.join(filter(None, [*map(str, share_dirs()), env.get("JUPYTER_PATH", "")]))
        env.pop("TRITON_INTERPRET", None)  # the lessons' setup() decides, as for a learner
        return env

    def __enter__(self) -> "LabServer":
        cmd = [
            sys.executable, "-m", "jupyterlab", "--no-browser", f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0", "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}", "--LabApp.expose_app_in_browser=True",
            "--ServerApp.disable_check_xsrf=False", "--LabApp.news_url=None",
        ]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        self.home.mkdir(parents=True, exist_ok=True)
        self._out = open(self.log, "w")
        env = self._prepare()
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._out, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=self.root)
        import urllib.request

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.base}/api/status?token={self.token}", timeout=5) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"JupyterLab did not answer within 120 s:\n{self.log.read_text()[-3000:]}")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the server and its kernels (own process group)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if getattr(self, "_out", None):
            self._out.close()

    def shutdown_kernels(self) -> int:
        """Shut down every session's kernel (the REST API Lab itself uses); how many there were."""
        import urllib.request

        with urllib.request.urlopen(f"{self.base}/api/sessions?token={self.token}", timeout=30) as r:
            sessions = json.loads(r.read())
        for session in sessions:
            request = urllib.request.Request(f"{self.base}/api/sessions/{session['id']}?token={self.token}", method="DELETE")
            urllib.request.urlopen(request, timeout=60).close()
        return len(sessions)

    def url(self, rel: str) -> str:
        return f"{self.base}/lab/tree/{rel}?reset&token={self.token}"


# ----------------------------------------------------------------------------------------
# What a notebook should show, and what the browser showed
# ----------------------------------------------------------------------------------------
def is_widget(output) -> bool:
    """A widget view: live, or as the outputs runner stores it (its plain-text fallback only)."""
    if output.get("output_type") != "display_data":
        return False
    data = output.get("data", {})
    return WIDGET_VIEW in data or set(data) == {"text/plain"}


def is_plot(output) -> bool:
    return any(m in output.get("data", {}) for m in PLOT_MIMES)


@dataclass
class Counts:
    code_cells: int = 0
    plots: int = 0
    widgets: int = 0


def expected(path: Path) -> Counts:
    """Code cells, plots and widgets of a stored notebook (what a full run produced)."""
    nb = nbformat.read(path, as_version=4)
    c = Counts()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        c.code_cells += 1
        for out in cell.get("outputs", []):
            c.plots += is_plot(out)
            c.widgets += is_widget(out)
    return c


@dataclass
class Seen:
    """One notebook after Run All in the browser."""

    saved: object  # the notebook Lab saved
    dom_plots: int
    dom_widgets: int
    widget_errors: list[str]
    seconds: float
    unexecuted: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    saved_counts: Counts = field(default_factory=Counts)


def problems(seen: Seen, want: Counts) -> list[str]:
    """Everything that differs from a clean full run (empty list = the notebook passed)."""
    out = []
    if seen.unexecuted:
        out.append(f"code cells not executed: {seen.unexecuted}")
    out += [f"error output: {e}" for e in seen.errors]
    out += [f"widget failed to render: {e}" for e in seen.widget_errors]
    if seen.saved_counts.code_cells != want.code_cells:
        out.append(f"{seen.saved_counts.code_cells} code cells, expected {want.code_cells}")
    if seen.dom_plots != want.plots or seen.saved_counts.plots != want.plots:
        out.append(f"plots: page shows {seen.dom_plots}, saved {seen.saved_counts.plots}, expected {want.plots}")
    if seen.dom_widgets != want.widgets or seen.saved_counts.widgets != want.widgets:
        out.append(f"widgets: page shows {seen.dom_widgets}, saved {seen.saved_counts.widgets}, expected {want.widgets}")
    return out


# ----------------------------------------------------------------------------------------
# Driving the page
# ----------------------------------------------------------------------------------------
CURRENT = "window.jupyterapp.shell.currentWidget"

_STATE_JS = f"""() => {{
  const w = {CURRENT};
  if (!w || !w.sessionContext) return null;
  const k = w.sessionContext.session && w.sessionContext.session.kernel;
  const prompts = [...w.node.querySelectorAll('.jp-InputPrompt')].map(p => p.textContent.trim());
  return {{kernel: k ? k.status : 'none', queued: prompts.filter(t => t.includes('*')).length,
           dirty: w.context.model.dirty}};
}}"""


def open_notebook(page, lab: LabServer, rel: str, timeout_s: float = 120) -> None:
    """Open ``rel`` in a fresh workspace and wait for its kernel to be idle."""
    page.goto(lab.url(rel))
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget", timeout=timeout_s * 1000)
    page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=timeout_s * 1000)
    wait_idle(page, timeout_s)


def wait_idle(page, timeout_s: float, settle_polls: int = 3) -> None:
    """Until the kernel is idle and no cell shows ``[*]``, for ``settle_polls`` polls in a row."""
    deadline, calm = time.monotonic() + timeout_s, 0
    while time.monotonic() < deadline:
        state = page.evaluate(_STATE_JS)
        if state and state["kernel"] == "idle" and state["queued"] == 0:
            calm += 1
            if calm >= settle_polls:
                return
        else:
            calm = 0
        page.wait_for_timeout(500)
    raise TimeoutError(f"kernel still busy after {timeout_s:.0f} s: {page.evaluate(_STATE_JS)}")


def menu(page, top: str, item: str) -> None:
    """Click ``top`` in the menu bar, then ``item`` in its menu (what a learner does)."""
    page.locator("#jp-MainMenu .lm-MenuBar-item", has_text=re.compile(rf"^{re.escape(top)}$")).click()
    page.locator(".lm-Menu-item:not(.lm-mod-hidden)", has=page.locator(".lm-Menu-itemLabel", has_text=re.compile(rf"^{re.escape(item)}$"))).first.click()


def save(page, timeout_s: float = 60) -> None:
    page.locator(".jp-NotebookPanel .jp-Notebook").first.click(position={"x": 5, "y": 5})
    page.keyboard.press("Control+s")
    page.wait_for_function(f"() => !{CURRENT}.context.model.dirty", timeout=timeout_s * 1000)


def run_notebook(page, lab: LabServer, rel: str, timeout_s: float = 1800) -> Seen:
    """Open ``rel``, Run ▸ Run All Cells, wait, save; what the page and the saved file show."""
    open_notebook(page, lab, rel)
    start = time.monotonic()
    menu(page, "Run", "Run All Cells")
    page.wait_for_timeout(1000)
    wait_idle(page, timeout_s)
    seconds = time.monotonic() - start
    page.wait_for_timeout(1000)  # late display messages (widgets render after the reply)
    save(page)
    panel = page.locator(".jp-NotebookPanel:visible").first
    # the cells' own outputs (a widget's inner outputs, e.g. interact's plot, are not counted)
    top = ".jp-Cell-outputArea > .jp-OutputArea-child > .jp-OutputArea-output"
    dom_plots = panel.locator(", ".join(f'{top}[data-mime-type="{m}"]' for m in PLOT_MIMES)).count()
    dom_widgets = panel.locator(f"{top}:has(.jupyter-widgets)").count()
    widget_errors = panel.get_by_text(re.compile("Error displaying widget")).all_inner_texts()
    nb = nbformat.read(lab.root / rel, as_version=4)
    seen = Seen(saved=nb, dom_plots=dom_plots, dom_widgets=dom_widgets, widget_errors=widget_errors, seconds=seconds)
    counts = Counts()
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        counts.code_cells += 1
        if cell.get("execution_count") is None:
            seen.unexecuted.append(i)
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                seen.errors.append(f"cell {i}: {out.get('ename')}: {out.get('evalue')}")
            counts.plots += is_plot(out)
            counts.widgets += out.get("output_type") == "display_data" and WIDGET_VIEW in out.get("data", {})
    seen.saved_counts = counts
    return seen


# ----------------------------------------------------------------------------------------
# Typing into a cell
# ----------------------------------------------------------------------------------------
_ACTIVE_SOURCE = f"() => {CURRENT}.content.activeCell.model.sharedModel.getSource()"


def select_cell(page, index: int) -> None:
    """Make cell ``index`` the active one (command mode), by clicking its prompt area."""
    cell = page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell").nth(index)
    cell.locator(".jp-InputPrompt").click()
    page.wait_for_function(f"() => {CURRENT}.content.activeCellIndex === {index}")


def type_code(page, code: str) -> str:
    """Replace the active cell's text by typing ``code`` key by key in its editor.

    The editor indents after Enter and closes brackets and quotes by itself; each line's
    automatic indentation (if any) is selected with Shift+Home and typed over (or deleted, for a
    blank line), so the cell ends up with exactly ``code``. Returns the cell's text as the notebook model holds it.
    """
    page.keyboard.press("Enter")  # command mode -> edit mode in the active cell
    page.keyboard.press("Control+a")
    page.keyboard.press("Delete")
    for i, line in enumerate(code.splitlines()):
        if i:
            page.keyboard.press("Enter")
            page.keyboard.press("Shift+Home")  # select the automatic indentation, if any
        if line:
            page.keyboard.type(line)
        else:
            page.keyboard.press("Delete")  # at the end of the text: deletes only a selection
    return page.evaluate(_ACTIVE_SOURCE)
