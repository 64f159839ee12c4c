"""Grade a class: ``make grade SUBMISSIONS=dir`` → ``grades/gradebook.csv``.

    python -m adam8lib.course.grading.gradebook SUBMISSIONS [--out grades/gradebook.csv]
        [--manifest exercises/.manifest.json] [--cell-timeout 120] [--learner-timeout 3600]
        [--jobs 1] [--sandbox bwrap|none] [--memory-limit 8192] [--max-output 65536]
        [--references zero|note] [--lessons notebooks] [--one-process]

``SUBMISSIONS`` holds one folder per learner with their ``NN_topic.ipynb`` workbooks (at any
depth; a file is matched to a workbook by name, else by its ``NN_`` prefix).

**How a learner is graded.** At the start every learner's notebooks are read into memory (later
changes to the files do not count). For each workbook the gradebook takes the learner's
*exercise cells* (tagged ``solution``) and starts one child process
(:mod:`adam8lib.course.grading.runner`) in which the learner's notebook never ran: it imports
the course's checks first, runs the exercise cells, verifies that the checks are still the
course's (source hashes and the identity of everything they rely on), calls each check from
the manifest on the learner's functions, and sends one result per exercise back through a pipe
the gradebook owns. The child runs in a bubblewrap sandbox — without one the gradebook refuses to grade unless
told ``--sandbox none`` — (:mod:`adam8lib.course.grading.sandbox`: no access to the repository, the other submissions or
the gradebook's files; no network; its own process namespace) with its memory (``--memory-limit``)
and output (``--max-output``) capped, a per-cell timeout (``--cell-timeout``) and a time limit per
learner (``--learner-timeout``), and the guard it installs (:mod:`adam8lib.course.grading.guard`)
reports on a second pipe: any alarm makes the workbook ``tampered``, a course reference used makes
that exercise ``reference`` (0 points; ``--references note``: a note only). Points come from the gradebook's own copy of the manifest: a
learner can never score more than a workbook's maximum.

For the workbooks of :data:`~adam8lib.course.grading.checker.SPLIT` the child is instead a *check
process* (:mod:`adam8lib.course.grading.checker`, not sandboxed: it runs course code only) that
holds the checks, their expected values, comparisons and the token, and starts the sandboxed
*learner process* (:mod:`adam8lib.course.grading.learner`, with the guard) that runs the exercise
cells and the learner's functions on the inputs it is sent, returning plain data
(:mod:`adam8lib.course.grading.plain`). ``--one-process`` grades every workbook with the runner.

**Output.** One CSV row per learner — ``learner``, the points of every exercise (columns named
by exercise id, in course order), ``total``, ``notes`` — appended to ``--out`` as soon as that
learner is done (so an interrupted run keeps every finished row) and the file rewritten in
learner order at the end. ``<out folder>/reports/<learner>.json`` holds every exercise's status
(and a failed check's message) and ``<learner>.log`` the children's (capped) output. Then
:mod:`adam8lib.course.grading.feedback` writes the pages people read: ``<out folder>/learners/
<learner>.html`` (score per exercise, hints, the lesson section to read again) and
``<out folder>/class.html`` (pass rates, the most frequent hints, links to every learner's page). Notes say what happened: missing or
unreadable workbooks, exercise cells that raised or timed out, a check that printed something
else, a child killed (out of memory, signal) or stopped at the time limit, checks tampered with,
course files changed during grading (restored; the learner scores 0), edited or deleted check
cells (harmless: the manifest's checks are what run) and library imports in exercise cells that
the official solution does not use (the instructor decides).
"""

from __future__ import annotations

import argparse
import ast
import csv
import hashlib
import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from ..second_machine import SECOND_MACHINE_ENV
from . import sandbox
from . import reaper
from . import withheld
from .channel import Phases as _Phases, converse as _converse, died as _died, kill as _kill, signal_name as _signal_name
from .conventions import (
    MANIFEST_NAME,
    CheckSpec,
    Manifest,
    cell_source,
    check_arguments,
    check_calls,
    defined_names,
    is_solution_cell,
    source_hash,
)
from .checker import SPLIT
from .feedback import write_pages

__all__ = ["LearnerGrade", "Grader", "GraderFailure", "find_workbooks", "grade_learner", "grade_class", "write_gradebook", "main"]

#: Exercise statuses a child may send; only "passed" scores.
STATUSES = ("passed", "failed", "timeout", "tampered", "error")
#: Statuses worth a note in the gradebook (plain failures are just 0 points); "reference" is the
#: gradebook's own (a course reference used, with ``--references zero``).
NOTED = ("timeout", "tampered", "error", "reference")
#: What a course reference used in an exercise scores: ``zero`` (0 points and a note) or ``note`` (a note only).
REFERENCE_POLICIES = ("zero", "note")


class GraderFailure(RuntimeError):
    """The grader could not grade: its sandbox or interpreter would not start, its kernel build is
    missing, a grading process failed before any learner code ran. Never a learner's fault: the run
    stops (``main`` exits with status 2 and this message) and no learner is scored or marked for it."""

    def __init__(self, problem: str, log: str = ""):
        self.problem, self.log = problem, log
        tail = "\n".join(line for line in log.strip().splitlines()[-12:])
        super().__init__(f"the grader failed, not the learners: {problem}"
                         + (f"\n--- the grading process said ---\n{tail}" if tail else "")
                         + "\nNo learner was scored for this; fix the grader's setup and grade again.")


def _grader_kernel() -> Path | None:
    """The folder of adam8lib's CPU kernel build, built (or loaded) here in the gradebook's process, or None
    where it cannot be built on this machine (the library then computes with its torch backend, in the
    learners' processes too)."""
    from adam8lib.kernels import cpu_build

    return None if cpu_build.unavailable_reason() is not None else cpu_build.build_directory()


@dataclass
class LearnerGrade:
    learner: str
    points: dict[str, int]  # exercise id -> points
    notes: list[str] = field(default_factory=list)
    statuses: dict[str, tuple[str, str]] = field(default_factory=dict)  # exercise -> (status, detail)
    errors: dict[str, str] = field(default_factory=dict)  # exercise -> first lines of a failed check's message

    @property
    def total(self) -> int:
        return sum(self.points.values())

    def validate(self, manifest: Manifest) -> None:
        """Points are whole, between 0 and each exercise's maximum, for the manifest's exercises only."""
        maximum = {spec.exercise: spec.points for spec in manifest.checks}
        if set(self.points) != set(maximum):
            raise ValueError(f"{self.learner}: graded exercises {sorted(self.points)} != manifest {sorted(maximum)}")
        for exercise, points in self.points.items():
            if not isinstance(points, int) or not 0 <= points <= maximum[exercise]:
                raise ValueError(f"{self.learner}: {points!r} points for {exercise} (max {maximum[exercise]})")

    def zero(self, note: str) -> None:
        self.points = dict.fromkeys(self.points, 0)
        self.notes.append(note)

    def to_json(self) -> dict:
        return {
            "learner": self.learner,
            "total": self.total,
            "points": self.points,
            "statuses": {k: {"status": s, "detail": d, **({"error": self.errors[k]} if self.errors.get(k) else {})}
                         for k, (s, d) in self.statuses.items()},
            "notes": self.notes,
        }


def find_workbooks(folder: Path, manifest: Manifest) -> tuple[dict[str, Path], list[str]]:
    """{manifest notebook: learner's file} for one learner, and notes about ambiguous files."""
    found: dict[str, list[Path]] = {}
    for path in sorted(folder.rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts or not path.is_file() or path.is_symlink():
            continue
        name = manifest.match(path.name)
        if name is not None:
            found.setdefault(name, []).append(path)
    chosen, notes = {}, []
    for name, paths in found.items():
        paths.sort(key=lambda p: (p.name != name, len(p.relative_to(folder).parts), str(p)))
        chosen[name] = paths[0]
        if len(paths) > 1:
            others = ", ".join(str(p.relative_to(folder)) for p in paths[1:])
            notes.append(f"{name}: graded {paths[0].relative_to(folder)}, ignored {others}")
    return chosen, notes


# ---------------------------------------------------------------------------------------------
# what the gradebook trusts: the checks' files, read before any learner runs
# ---------------------------------------------------------------------------------------------
def _check_modules(spec: CheckSpec) -> list[str]:
    tree = ast.parse(spec.source)
    names = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return names


def checks_origin(manifest: Manifest) -> dict[str, dict]:
    """{module: {"origin": file, "files": {file: sha256}}} for every module the check cells import."""
    out: dict[str, dict] = {}
    # resolve as the children will: with this environment's PYTHONPATH in front
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    for spec in manifest.checks:
        for name in _check_modules(spec):
            if name in out:
                continue
            sys.path[:0] = extra
            try:
                found = importlib.util.find_spec(name)
            finally:
                del sys.path[: len(extra)]
            if found is None or not found.origin:
                raise ValueError(f"check cell of {spec.exercise} imports {name}, which is not installed")
            origin = os.path.realpath(found.origin)
            if found.submodule_search_locations:
                files = sorted(p for loc in found.submodule_search_locations for p in Path(loc).rglob("*.py"))
            else:
                files = [Path(origin)]
            out[name] = {
                "origin": origin,
                "files": {os.path.realpath(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files},
            }
    return out


def library_references(modules: dict[str, dict]) -> list[str]:
    """The dotted names of the ``adam8lib`` functions the checks' modules import (what the checks compare with),
    found here, in the grader's process: a split workbook's learner process is not shown the checks (under
    bubblewrap), so its guard learns them from the job, by name."""
    from .runner import course_references

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a check that does not load is reported by the grading process
            continue
    forbidden, _ = course_references({name: info["origin"] for name, info in modules.items()}, [], [])
    return sorted({dotted for dotted in forbidden.values() if not dotted.startswith("adam8lib.course")})


def _differs(path: Path, data: bytes) -> bool:
    """Whether the course file ``path`` is no longer the plain file with bytes ``data`` (gone, a link, unreadable)."""
    try:
        return not (path.is_file() and not path.is_symlink() and path.read_bytes() == data)
    except OSError:
        return True


class CourseFiles:
    """Bytes of the checks' files and the manifest, read at the start; :meth:`restore` puts them back."""

    def __init__(self, paths: list[Path]):
        self.original = {Path(p): Path(p).read_bytes() for p in paths if Path(p).is_file()}
        self.lock = threading.Lock()

    def changed(self) -> list[str]:
        """Names of the files that differ from the bytes read at the start (nothing is written)."""
        return [path.name for path, data in self.original.items() if _differs(path, data)]

    def restore(self) -> list[str]:
        """Names of the files that changed (each rewritten with its original bytes)."""
        changed = []
        with self.lock:
            for path, data in self.original.items():
                if _differs(path, data):
                    changed.append(path.name)
                    if path.is_symlink() or path.is_dir():
                        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink()
                    path.write_bytes(data)
        return changed


# ---------------------------------------------------------------------------------------------
# one learner workbook -> one child
# ---------------------------------------------------------------------------------------------
def _exercise_cells(nb: dict, name: str, specs: list[CheckSpec]) -> tuple[list[dict], list[str]]:
    """The learner's exercise cells (tagged ``solution``), in order, and notes.

    A function the checks need that no exercise cell defines (the learner wrote it in a new
    cell, which has no tag) is taken from the last other code cell that defines it, with a note.
    """
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list):
        raise ValueError("no list of cells")
    code = [(i, c) for i, c in enumerate(cells) if isinstance(c, dict) and c.get("cell_type") == "code"]
    chosen = {i: cell_source(c) for i, c in code if is_solution_cell(c)}
    defined = set().union(*(defined_names(src) for src in chosen.values())) if chosen else set()
    notes = []
    for spec in specs:
        for needed in sorted(check_arguments(spec.source, spec.check) - defined):
            donors = [i for i, c in code if i not in chosen and not check_calls(cell_source(c))
                      and needed in defined_names(cell_source(c))]  # fmt: skip
            if donors:
                chosen[donors[-1]] = cell_source(cells[donors[-1]])
                defined |= defined_names(chosen[donors[-1]])
                notes.append(f"{name}: {needed} taken from cell {donors[-1]}, which is not an exercise cell")
    return [{"index": i, "source": chosen[i]} for i in sorted(chosen)], notes


def _integrity_notes(nb: dict, name: str, specs: list[CheckSpec]) -> list[str]:
    """Edited / deleted check cells: harmless now (the manifest's checks run), but said."""
    notes = []
    sources = [cell_source(c) for c in nb.get("cells", []) if isinstance(c, dict) and c.get("cell_type") == "code"]
    for spec in specs:
        calling = [s for s in sources if spec.check in check_calls(s)]
        if not calling:
            notes.append(f"{name} {spec.label} {spec.exercise}: check cell deleted (graded with the original check)")
        elif all(source_hash(s) != spec.sha256 for s in calling):
            notes.append(f"{name} {spec.label} {spec.exercise}: check cell edited (graded with the original check)")
    return notes


def _import_flags(cells: list[dict], name: str, manifest: Manifest) -> list[str]:
    """Exercise cells that import library code the official solution does not use."""
    allowed = set(manifest.library_imports(name))
    watched = set(manifest.implementations(name))
    flags = []
    for cell in cells:
        try:
            tree = ast.parse(cell["source"])
        except SyntaxError:
            continue
        used = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                used.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                used.update(alias.name for alias in node.names)
            elif isinstance(node, ast.Attribute):
                parts, value = [node.attr], node.value
                while isinstance(value, ast.Attribute):
                    parts.append(value.attr)
                    value = value.value
                if isinstance(value, ast.Name):
                    dotted = ".".join([value.id, *reversed(parts)])
                    if dotted in watched:
                        used.add(dotted)
        for dotted in sorted(used):
            library = dotted.split(".")[0] in ("adam8lib", "bitsandbytes") and not dotted.startswith("adam8lib.course")
            if (library and dotted not in allowed) or dotted in watched:
                flags.append(f"{name} cell {cell['index']}: uses {dotted} (library code the solution does not use; "
                             "the instructor decides)")  # fmt: skip
    return flags


def _remove(path: Path) -> None:
    """Delete a scratch folder even when the learner made parts of it read-only."""

    def unlock(function, name, _exc):
        try:
            os.chmod(os.path.dirname(name), 0o700)
            os.chmod(name, 0o700)
            function(name)
        except OSError:
            pass

    shutil.rmtree(path, onerror=unlock)


#: What a grading child inherits from the gradebook's environment: where Python and torch live, the
#: thread counts, and the settings that decide how this machine computes (torch's CPU kernels,
#: MKL/oneDNN instruction sets, adam8lib's kernel flags: those of SECOND_MACHINE_ENV and MKL's
#: reproducibility mode), so that a grade is computed the way the instructor's machine is set up.
_PASSED_ENV = frozenset({"PATH", "PYTHONPATH", "LANG", "TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", "TORCH_EXTENSIONS_DIR",
                         "MKL_CBWR", *SECOND_MACHINE_ENV})

SCRATCH_PREFIX = "adam8-grading-"
#: the files of ``adam8lib/course/checks`` a split workbook's learner process sees (under bubblewrap)
LEARNER_VIEW_OF_CHECKS = ("__init__.py", "_common.py")


def _remove_stale_scratch() -> None:
    """Remove scratch roots left by a gradebook that was killed (its ``.owner`` pid is gone)."""
    for root in Path(tempfile.gettempdir()).glob(SCRATCH_PREFIX + "*"):
        try:
            pid = int((root / ".owner").read_text(encoding="utf-8"))
            os.kill(pid, 0)
        except ProcessLookupError:
            _remove(root)
        except (OSError, ValueError):
            continue  # not ours to judge (no owner file yet, or another user's)


@dataclass
class Grader:
    """Everything a class run shares: the manifest, the trusted checks, limits and the sandbox."""

    manifest: Manifest
    cell_timeout: float = 120
    learner_timeout: float = 3600
    sandbox: str = "auto"
    memory_mb: int | None = 8192
    max_output: int = 65536
    hide: list = field(default_factory=list)
    reports: Path | None = None
    references: str = "zero"
    #: the workbooks of :data:`~adam8lib.course.grading.checker.SPLIT` graded by a check process
    #: talking to a sandboxed learner process (False: every workbook in one guarded process)
    split: bool = True
    #: extra arguments of the learner process (tests: ``("--no-guard",)``)
    learner_flags: tuple = ()

    def __post_init__(self):
        if self.references not in REFERENCE_POLICIES:
            raise ValueError(f"references must be one of {REFERENCE_POLICIES}, got {self.references!r}")
        if self.cell_timeout <= 0 or self.learner_timeout <= 0:
            raise ValueError("timeouts must be positive")
        if self.sandbox not in sandbox.MODES:
            raise ValueError(f"sandbox must be one of {sandbox.MODES}, got {self.sandbox!r}")
        if self.sandbox != "none" and sandbox.available():
            raise RuntimeError(f"no sandbox: {sandbox.available()}. The gradebook runs learners' code only in its "
                               "bubblewrap sandbox: install it (make grade does where it can), or pass --sandbox none "
                               "to grade without one (learners' code then runs with your permissions)")
        self.modules = checks_origin(self.manifest)
        self.reference_names = library_references(self.modules)
        paths = [Path(p) for info in self.modules.values() for p in info["files"]]
        package = importlib.util.find_spec("adam8lib.course.checks")
        paths += [p for loc in package.submodule_search_locations for p in sorted(Path(loc).rglob("*.py"))]
        if self.manifest.path is not None:
            paths.append(Path(self.manifest.path))
        self.course = CourseFiles(paths)
        self.course_setup = any(n.startswith("adam8lib") for n in self.modules)
        _remove_stale_scratch()
        self.scratch_root = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
        (self.scratch_root / ".owner").write_text(str(os.getpid()), encoding="utf-8")
        self.active: set = set()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.failure: GraderFailure | None = None
        self.mode = "none" if self.sandbox == "none" else "bwrap"
        # orphans of learners' processes (a double fork, setsid) become this process's children: ended after each
        # grading process and before the gradebook is written (reaper); processes older than this are never touched
        self.since, self.subreaper = reaper.now(), reaper.become_subreaper()
        try:
            self.kernel = _grader_kernel() if self.course_setup else None
            self.withheld = self.withheld_views()
            self.preflight()
        except BaseException:
            self.close()
            raise

    def python(self) -> list[str]:
        # -s: no user site-packages (HOME is the child's scratch folder: a learner could plant a usercustomize there)
        return [sys.executable, "-s", *(["-P"] if sys.version_info >= (3, 11) else [])]

    def preflight(self) -> None:
        """Start the learners' Python once, confined exactly as a learner's process will be, before any
        learner is graded: a sandbox or an interpreter that cannot start is the grader's problem
        (:class:`GraderFailure`), never every learner's 0."""
        probe = ("import importlib.util as u, sys\n"
                 "missing = [m for m in ('adam8lib', 'torch') if u.find_spec(m) is None]\n"
                 "sys.exit('cannot import ' + ', '.join(missing) if missing else 0)")  # fmt: skip
        scratch = Path(tempfile.mkdtemp(prefix="preflight-", dir=self.scratch_root))
        try:
            cmd, _, workdir = sandbox.wrap([*self.python(), "-c", probe], scratch=scratch,
                                           hide=[*self.hide, self.scratch_root], mode=self.mode,
                                           memory_mb=self.memory_mb, file_mb=256)  # fmt: skip
            try:
                proc = subprocess.run(cmd, env=self._env(workdir), cwd=scratch if self.mode == "none" else None,
                                      stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)  # fmt: skip
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise GraderFailure(f"the learners' Python ({sys.executable}) could not be started "
                                    f"(sandbox: {self.mode}): {type(exc).__name__}: {exc}") from None
        finally:
            _remove(scratch)
        if proc.returncode != 0:
            where = "in the bubblewrap sandbox" if self.mode == "bwrap" else "as a grading child"
            raise GraderFailure(f"the learners' Python ({sys.executable}) does not start {where}: it "
                                f"{_died(proc.returncode)}", proc.stdout + proc.stderr)

    def give_kernel(self, home: Path) -> None:
        """A copy of the gradebook's kernel build in a child's cache folder (``home/.cache/adam8lib``), so that no
        learner's process compiles it (and none can fail to): a child that still cannot load it stops the run."""
        if self.kernel is not None and self.kernel.is_dir():
            shutil.copytree(self.kernel, home / ".cache" / "adam8lib" / self.kernel.name, symlinks=True,
                            ignore=shutil.ignore_patterns("lock", "build.flock"))

    def close(self) -> None:
        with self.lock:
            reaper.sweep(keep={p.pid for p in self.active}, since=self.since)
        if self.subreaper:
            self.subreaper = False
            reaper.release_subreaper()
        if self.scratch_root.exists():
            _remove(self.scratch_root)

    def stop(self) -> None:
        """Stop the run: kill every running child; learners not finished get a note."""
        self.stopped.set()
        with self.lock:
            for proc in list(self.active):
                _kill(proc)

    def _env(self, home: Path, cache: Path | None = None) -> dict:
        env = {k: v for k, v in os.environ.items() if k in _PASSED_ENV}
        env.update(HOME=str(home), TMPDIR=str(home), PYTHONIOENCODING="utf-8", PYTHONDONTWRITEBYTECODE="1",
                   PYTHONHASHSEED="0", MPLBACKEND="Agg", LC_ALL="C.UTF-8",
                   ADAM8LIB_CACHE_DIR=str(cache if cache is not None else Path(home) / ".cache" / "adam8lib"))  # fmt: skip
        return env

    def run_workbook(self, name: str, nb: dict, deadline: float, log: list[str]) -> tuple[dict, list[str]]:
        """{exercise: (status, detail, error)} for one workbook of a learner, and notes."""
        specs = self.manifest.notebooks[name]
        cells, taken = _exercise_cells(nb, name, specs)
        notes = _integrity_notes(nb, name, specs) + taken + _import_flags(cells, name, self.manifest)
        if not cells:
            notes.append(f"{name}: no exercise cells (cells tagged 'solution'); scores 0")
            return {}, notes
        token = secrets.token_hex(16)
        job = {
            "token": token,
            "notebook": name,
            "cells": cells,
            "checks": [{"exercise": s.exercise, "source": s.source, "expected_output": s.expected_output} for s in specs],
            "modules": self.modules,
            "cell_timeout": self.cell_timeout,
            "max_output": self.max_output,
            "course_setup": self.course_setup,
            "library_imports": self.manifest.library_imports(name),
            "implementations": self.manifest.implementations(name),
            "references": self.reference_names,
            "kernel": self.kernel is not None,
        }
        split = self.split and name in SPLIT
        # a learner's code that ignores its own process's alarm is stopped by this process's clock (Phases) and
        # the workbook graded again without that cell or check: at most one more run per phase, within the deadline
        skip_cells: list[int] = []
        skip_checks: dict[str, str] = {}
        earlier_alarms = ""
        limit = self.phase_limit()
        while True:
            job["skip_cells"], job["skip_checks"] = list(skip_cells), list(skip_checks)
            phases = None if split else _Phases([c["index"] for c in cells if c["index"] not in skip_cells],
                                               [s.exercise for s in specs if s.exercise not in skip_checks], limit, token)
            messages, text, rc, timed_out, alarm_text = self._attempt(name, job, split, deadline, phases)
            how = "checks in a process of their own" if split else "one guarded process"
            log.append(f"===== {name} (sandbox: {self.mode}; {how}) =====\n{text}")
            expired = phases.expired if phases is not None else None
            if expired is None or self.stopped.is_set() or time.monotonic() >= deadline:
                break
            kind, key = expired
            if kind == "cell":
                skip_cells.append(key)
                notes.append(f"{name}: cell {key} (exercise cell) ran past {self.cell_timeout:g} s, ignoring its time "
                             "limit, and was stopped from outside by the grader; graded again without it")  # fmt: skip
            else:
                skip_checks[key] = (f"the check of {key} ran past {self.cell_timeout:g} s, ignoring its time limit, "
                                    "and was stopped from outside by the grader")  # fmt: skip
            earlier_alarms += "".join(line + "\n" for line in alarm_text.splitlines() if line.startswith(("alarm ", "ref ")))
        results: dict[str, tuple[str, str, str]] = {}
        if messages is None:
            notes.append(f"{name}: the result channel carried something that is not a result; scores 0")
            return {}, notes
        known = {s.exercise for s in specs}
        finished = started = False
        kinds = ("result", "note", "done", "started", "phase", *(("grader",) if split else ()))
        for message in messages:
            kind = message.get("kind") if isinstance(message, dict) else None
            if finished or kind not in kinds or message.get("token") != token or (kind == "started" and started):
                notes.append(f"{name}: unexpected message on the result channel; scores 0")
                return {}, notes
            if kind == "grader":  # the check process (no learner code there) could not do its part
                raise GraderFailure(f"grading {name}: {str(message.get('text'))[:2000]}", text)
            if kind == "phase":  # the clock's (Phases)
                continue
            if kind == "started":
                started = True
            elif kind == "done":
                finished = True
            elif kind == "note":
                notes.append(f"{name}: {str(message.get('text'))[:300]}")
            else:
                exercise, status = message.get("exercise"), message.get("status")
                if exercise not in known or exercise in results or status not in STATUSES:
                    notes.append(f"{name}: an invalid or repeated result on the result channel; scores 0")
                    return {}, notes
                results[exercise] = (status, str(message.get("detail", ""))[:300], str(message.get("error", ""))[:5000])
        if not started and not finished and not timed_out and not self.stopped.is_set():
            # no learner code had run yet: the grading process could not start or set up (sandbox, interpreter, kernel)
            raise GraderFailure(f"grading {name}: the grading process {_died(rc)} before any learner code ran", text)
        for exercise, detail in skip_checks.items():
            results.setdefault(exercise, ("timeout", detail, ""))
        results, more = self._guarded(name, specs, results, earlier_alarms + alarm_text, token, finished)
        notes.extend(more)
        if not finished:
            if expired is not None and not self.stopped.is_set():
                what = f"cell {expired[1]}" if expired[0] == "cell" else f"the check of {expired[1]}"
                notes.append(f"{name}: {what} ran past {self.cell_timeout:g} s, ignoring its time limit, and was stopped "
                             "from outside by the grader at the learner time limit; exercises without a result score 0")
            elif self.stopped.is_set():
                notes.append(f"{name}: grading was interrupted; exercises without a result score 0")
            elif timed_out:
                notes.append(f"{name}: grading stopped at the learner time limit ({self.learner_timeout:g} s); "
                             "exercises without a result score 0")  # fmt: skip
            else:
                notes.append(f"{name}: the grading process {_died(rc)} before it finished; "
                             "exercises without a result score 0")  # fmt: skip
        return results, notes

    def learner_view(self) -> list[tuple[Path, list[str]]]:
        """What the learner process of a split workbook is not shown (under bubblewrap): the course's checks — their
        references, helpers, case tables and hints — leaving only the package's ``__init__.py`` (which then finds no
        check module) and ``_common.py`` (the stub's recognition). The check process holds the checks; the learner
        process runs the learner's cells and the course's drivers, which need neither."""
        spec = importlib.util.find_spec("adam8lib.course.checks")
        return [(Path(loc), list(LEARNER_VIEW_OF_CHECKS)) for loc in (spec.submodule_search_locations or [])]

    def withheld_views(self) -> dict[str, list[tuple[Path, Path]]]:
        """Per split workbook under bubblewrap, the files its learner process is shown in place of the library's
        (:mod:`.withheld`): the modules defining the implementations the manifest says its exercises ask for, with
        those definitions replaced by stand-ins. A name that cannot be withheld is the grader's problem."""
        if self.mode != "bwrap" or not self.split:
            return {}
        views = {}
        for name in self.manifest.notebooks:
            wanted = self.manifest.implementations_by_label(name)
            if name not in SPLIT or not any(wanted.values()):
                continue
            try:
                views[name] = withheld.write_view(wanted, self.manifest.library_imports(name),
                                                  self.scratch_root / "withheld" / Path(name).stem)
            except withheld.Withheld as exc:
                raise GraderFailure(f"the manifest's implementations of {name} cannot be withheld: {exc}") from None
        return views

    def phase_limit(self) -> float:
        """Seconds a cell or a check may run, by this process's clock, before its grading process is killed from
        outside: the cell timeout (which the process enforces itself first) and a margin."""
        return self.cell_timeout + max(2.0, min(10.0, 0.1 * self.cell_timeout))

    def _attempt(self, name: str, job: dict, split: bool, deadline: float, phases):
        """One grading process (and its learner process) for a workbook, in fresh scratch folders."""
        scratch = Path(tempfile.mkdtemp(prefix="learner-", dir=self.scratch_root))
        # the check process's own folder: nothing the learner's process writes (caches, kernels) is ever loaded there
        home = Path(tempfile.mkdtemp(prefix="checker-", dir=self.scratch_root)) if split else scratch
        try:
            self.give_kernel(scratch)
            if split:
                self.give_kernel(home)
            python = [*self.python(), "-m"]
            if split:
                # the checks in a check process of their own, the learner's code in a sandboxed learner process
                argv = [*python, "adam8lib.course.grading.learner", "--requests", "{requests}", "--replies",
                        "{replies}", "--alarm-fd", "{alarm}", *self.learner_flags]  # fmt: skip
                job["learner_cmd"], _, workdir = sandbox.wrap(argv, scratch=scratch, hide=[*self.hide, self.scratch_root],
                                                              mode=self.mode, memory_mb=self.memory_mb, file_mb=256,
                                                              conceal=self.learner_view(),
                                                              replace=self.withheld.get(name, []))  # fmt: skip
                job["learner_cwd"] = str(scratch) if self.mode == "none" else None
                job["learner_env"] = self._env(workdir)
                job["early_start"] = self.mode == "bwrap"  # read-only files: no need to wait for the checks' import
                job["phase_limit"] = self.phase_limit()
                cmd, cwd = [*python, "adam8lib.course.grading.checker", "--result-fd", "{fd}", "--alarm-fd", "{alarm}"], home
                workdir = home  # the check process's HOME and TMPDIR: outside the sandbox
            else:
                argv = [*python, "adam8lib.course.grading.runner", "--result-fd", "{fd}", "--alarm-fd", "{alarm}"]
                cmd, _, workdir = sandbox.wrap(argv, scratch=scratch, hide=[*self.hide, self.scratch_root],
                                               mode=self.mode, memory_mb=self.memory_mb, file_mb=256)  # fmt: skip
                cwd = scratch if self.mode == "none" else None
            env = self._env(workdir)
            return _converse(cmd, env, cwd, json.dumps(job).encode(), deadline, self.active, self.lock, phases=phases,
                             since=self.since)  # fmt: skip
        finally:
            _remove(scratch)
            if home != scratch:
                _remove(home)

    def _guarded(self, name: str, specs, results: dict, alarm_text: str, token: str, finished: bool):
        """Apply what the guard reported (:mod:`adam8lib.course.grading.guard`): any alarm makes every
        exercise of the workbook ``tampered``; a course reference used makes that exercise
        ``reference`` (0 points) or, with ``references="note"``, only adds a note; a child that
        finished without the guard's end marker closed the alarm channel (tampered)."""
        alarms, refs, ended = [], {}, False
        for line in alarm_text.splitlines():
            kind, _, rest = line.partition(" ")
            if kind == "alarm":
                alarms.append(rest)
            elif kind == "ref":
                exercise, _, text = rest.partition(" ")
                refs.setdefault(exercise, []).append(text)
            elif kind == "end":
                ended = rest.strip() == token
        if finished and not ended:
            alarms.append("the guard's alarm channel was closed or its end is missing")
        if alarms:
            shown = "; ".join(dict.fromkeys(alarms))
            shown = shown if len(shown) <= 1500 else shown[:1497] + "..."
            return ({s.exercise: ("tampered", "the grading guard stopped learner code (see the notes)", "") for s in specs},
                    [f"{name}: tampered: {shown}"])
        notes = []
        for spec in specs:
            found = list(dict.fromkeys(refs.get(spec.exercise, [])))
            if not found:
                continue
            text = "; ".join(found)[:300]
            if self.references == "zero" and spec.exercise in results:
                results[spec.exercise] = ("reference", text, "")
            else:
                notes.append(f"{name} {spec.label} {spec.exercise}: uses a course reference ({text}); the instructor decides")
        return results, notes

    def grade(self, learner: str, notebooks: dict[str, bytes], notes: list[str]) -> LearnerGrade:
        """Grade one learner from the notebook bytes read at the start."""
        grade = LearnerGrade(learner, {spec.exercise: 0 for spec in self.manifest.checks}, list(notes))
        deadline = time.monotonic() + self.learner_timeout
        log: list[str] = []
        changed_before: list[str] = []
        for name in self.manifest.notebooks:
            if self.mode == "none":  # what this learner's earlier workbook changed is put back before the next one runs
                changed_before += self.course.restore()

            def ungraded(status: str, note: str, name: str = name) -> None:  # the workbook's exercises: 0, noted once
                grade.notes.append(note)
                for spec in self.manifest.notebooks[name]:
                    grade.statuses[spec.exercise] = (status, note)

            if name not in notebooks:
                ungraded("missing", f"{name} missing")
                continue
            if self.stopped.is_set():
                ungraded("not run", f"{name}: not graded (grading was interrupted)")
                continue
            try:
                nb = json.loads(notebooks[name].decode("utf-8"))
                if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
                    raise ValueError("not a notebook (no list of cells)")
            except (ValueError, UnicodeDecodeError) as exc:
                ungraded("unreadable", f"{name} could not be read ({type(exc).__name__}: {str(exc)[:120]}); scores 0")
                continue
            if time.monotonic() >= deadline:
                ungraded("not run", f"{name}: not graded, the learner time limit ({self.learner_timeout:g} s) was used up")
                continue
            try:
                results, more = self.run_workbook(name, nb, deadline, log)
            except GraderFailure as exc:  # stop every other learner's grading too: nobody is scored for it
                with self.lock:
                    self.failure = self.failure or exc
                if self.mode == "none":
                    self.course.restore()
                self.stop()
                raise
            grade.notes.extend(more)
            for spec in self.manifest.notebooks[name]:
                status, detail, error = results.get(spec.exercise, ("not run", "", ""))
                grade.statuses[spec.exercise] = (status, detail)
                if error:
                    grade.errors[spec.exercise] = error
                grade.points[spec.exercise] = spec.points if status == "passed" else 0
                if status in NOTED:
                    grade.notes.append(f"{name} {spec.label} {spec.exercise}: {status} ({detail})")
                for dotted, asked in withheld.used(f"{detail} {error}"):
                    grade.notes.append(f"{name} {spec.label} {spec.exercise}: called {dotted}, which exercise {asked} "
                                       "asks the learner to write (not in the learner view while grading)")
        if self.mode == "none":
            changed = list(dict.fromkeys(changed_before + self.course.restore()))
        else:  # the sandbox shows the course read-only: a change is someone else's (never restored over, never scored)
            changed = self.course.changed()
            if changed:
                failure = GraderFailure(f"course files changed on disk while {learner} was graded, not by the learner (the "
                                        f"sandbox shows them read-only): {', '.join(changed)}; grade from a checkout "
                                        "nobody edits")  # fmt: skip
                with self.lock:
                    self.failure = self.failure or failure
                self.stop()
                raise failure
        if self.failure is not None:  # cut short by the grader's failure elsewhere: no row, no report
            raise GraderFailure(self.failure.problem, self.failure.log)
        if changed:
            grade.zero(f"course files changed while this learner was graded (restored): {', '.join(changed)}; scores 0")
        grade.validate(self.manifest)
        if self.reports is not None:
            self.reports.mkdir(parents=True, exist_ok=True)
            (self.reports / f"{learner}.json").write_text(json.dumps(grade.to_json(), indent=1) + "\n", encoding="utf-8")
            (self.reports / f"{learner}.log").write_text("\n".join(log), encoding="utf-8")
        return grade


# ---------------------------------------------------------------------------------------------
# a class
# ---------------------------------------------------------------------------------------------
def _read_submission(folder: Path, manifest: Manifest) -> tuple[dict[str, bytes], list[str]]:
    """The bytes of a learner's matched notebooks, read once at the start, and notes."""
    workbooks, notes = find_workbooks(folder, manifest)
    data = {}
    for name, path in workbooks.items():
        try:
            data[name] = path.read_bytes()
        except OSError as exc:
            notes.append(f"{name} could not be read ({exc})")
    return data, notes


def grade_learner(folder: Path, manifest: Manifest, *, reports: Path | None = None, **options) -> LearnerGrade:
    """Grade one learner folder (see :class:`Grader` for the options)."""
    grader = Grader(manifest, reports=reports, hide=[folder.parent], **options)
    try:
        data, notes = _read_submission(folder, manifest)
        return grader.grade(folder.name, data, notes)
    finally:
        grader.close()


class GradebookWriter:
    """The CSV: header at once, one row appended (and flushed to disk) per finished learner."""

    def __init__(self, out: Path, manifest: Manifest):
        self.out, self.exercises = Path(out), [spec.exercise for spec in manifest.checks]
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.fh = self.out.open("w", newline="", encoding="utf-8")
        self.writer = csv.writer(self.fh)
        self._write(["learner", *self.exercises, "total", "notes"])

    def _write(self, row) -> None:
        self.writer.writerow(row)
        self.fh.flush()
        os.fsync(self.fh.fileno())

    def row(self, grade: LearnerGrade) -> list:
        return [grade.learner, *(grade.points[e] for e in self.exercises), grade.total, "; ".join(grade.notes)]

    def add(self, grade: LearnerGrade) -> None:
        self._write(self.row(grade))

    def close(self) -> None:
        if not self.fh.closed:
            self.fh.close()

    def finish(self, grades: list[LearnerGrade]) -> None:
        """Rewrite the file with every learner, in name order (atomically)."""
        self.fh.close()
        write_gradebook(grades, Manifest({}, None), self.out, exercises=self.exercises)


def write_gradebook(grades: list[LearnerGrade], manifest: Manifest, out: Path, exercises: list[str] | None = None) -> None:
    """CSV: learner, one column per exercise id (course order), total, notes (written atomically)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    exercises = exercises if exercises is not None else [spec.exercise for spec in manifest.checks]
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["learner", *exercises, "total", "notes"])
        for grade in sorted(grades, key=lambda g: g.learner):
            writer.writerow([grade.learner, *(grade.points[e] for e in exercises), grade.total, "; ".join(grade.notes)])
    os.replace(tmp, out)


def grade_class(
    submissions: Path,
    manifest: Manifest,
    *,
    cell_timeout: float = 120,
    learner_timeout: float = 3600,
    jobs: int = 1,
    reports: Path | None = None,
    out: Path | None = None,
    progress: bool = True,
    sandbox: str = "auto",
    memory_mb: int | None = 8192,
    max_output: int = 65536,
    on_start=None,
    references: str = "zero",
    split: bool = True,
    learner_flags: tuple = (),
) -> list[LearnerGrade]:
    """Grade every learner folder of ``submissions`` (sorted by name); rows go to ``out`` as they finish.

    A learner whose grading fails for any reason gets a row of zeros with a note; the others are
    unaffected. ``on_start(grader)`` is called once the shared state exists (``main`` uses it to
    stop the run cleanly on SIGTERM/SIGINT).
    """
    from tqdm.auto import tqdm

    submissions = Path(submissions)
    if not submissions.is_dir():
        raise FileNotFoundError(f"no submissions folder at {submissions}")
    folders = sorted(p for p in submissions.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith("."))
    if not folders:
        raise ValueError(f"{submissions} has no learner folders (one subfolder per learner)")
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    # invisible to learners: the submissions, the gradebook's folder and the reports
    hide = [submissions, *([Path(out).parent] if out is not None else []), *([Path(reports)] if reports else [])]
    grader = Grader(manifest, cell_timeout=cell_timeout, learner_timeout=learner_timeout, sandbox=sandbox,
                    memory_mb=memory_mb, max_output=max_output, hide=hide, reports=reports, references=references,
                    split=split, learner_flags=tuple(learner_flags))  # fmt: skip
    if on_start is not None:
        on_start(grader)
    writer = GradebookWriter(out, manifest) if out is not None else None
    # every learner's notebooks are read before anyone's code runs
    read = {folder.name: _read_submission(folder, manifest) for folder in folders}
    originals = {folder.name: dict(read[folder.name][0]) for folder in folders}

    def one(name: str) -> LearnerGrade:
        data, notes = read[name]
        if grader.failure is not None:  # the grader failed: nobody after is graded, and no row says otherwise
            raise GraderFailure(grader.failure.problem, grader.failure.log)
        if grader.stopped.is_set():
            grade = LearnerGrade(name, {s.exercise: 0 for s in manifest.checks})
            grade.notes.append("not graded (grading was interrupted)")
            return grade
        try:
            return grader.grade(name, data, notes)
        except GraderFailure:
            raise
        except Exception as exc:  # one learner never stops the class
            grade = LearnerGrade(name, {s.exercise: 0 for s in manifest.checks}, list(notes))
            grade.notes.append(f"grading error ({type(exc).__name__}: {str(exc)[:200]}); scores 0")
            return grade

    grades: list[LearnerGrade] = []
    failure: GraderFailure | None = None
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(one, folder.name) for folder in folders]
            for future in tqdm(as_completed(futures), total=len(folders), desc="grading", unit="learner",
                               disable=not progress):  # fmt: skip
                try:
                    grade = future.result()
                except GraderFailure as exc:  # the grader's own problem: stop, and score nobody for it
                    failure = failure or grader.failure or exc
                    grader.stop()
                    continue
                grades.append(grade)  # finished before the grader failed (if it did): a grade like any other
                if writer is not None:
                    writer.add(grade)
    finally:
        grader.close()
        if failure is not None and writer is not None:
            writer.close()
    if failure is not None:
        kept = f"; {out} keeps the {len(grades)} learner(s) graded before it" if out is not None and grades else ""
        raise GraderFailure(failure.problem + kept, failure.log) from failure
    by_name = {g.learner: g for g in grades}
    for folder in folders:  # files changed on disk while grading: the copy read at the start counted
        paths = find_workbooks(folder, manifest)[0]
        changed = []
        for name, data in originals[folder.name].items():
            path = paths.get(name)
            try:
                same = path is not None and path.read_bytes() == data
            except OSError:
                same = False
            if not same:
                changed.append(name)
        if changed and folder.name in by_name:
            by_name[folder.name].notes.append(
                f"changed on disk during grading (the copy read at the start was graded): {', '.join(changed)}"
            )
    grades.sort(key=lambda g: g.learner)
    if writer is not None:
        writer.finish(grades)
    return grades


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m adam8lib.course.grading.gradebook",
        description="Grade a folder of learner submissions (one subfolder each) into a CSV gradebook.",
    )
    parser.add_argument("submissions", type=Path, help="folder with one subfolder of notebooks per learner")
    parser.add_argument("--out", type=Path, default=Path("grades/gradebook.csv"), help="gradebook CSV to write")
    parser.add_argument("--manifest", type=Path, default=Path("exercises") / MANIFEST_NAME, help="grading manifest")
    parser.add_argument("--cell-timeout", type=float, default=120, help="seconds per exercise cell and per check (default 120)")
    parser.add_argument("--learner-timeout", type=float, default=3600, help="seconds per learner (default 3600)")
    parser.add_argument("--jobs", type=int, default=1, help="learners graded at the same time (default 1)")
    parser.add_argument("--sandbox", choices=sandbox.MODES, default="bwrap",
                        help="bwrap (default; auto is the same): learners' code runs in bubblewrap, and without it "
                             "the gradebook refuses to grade; none: plain child processes with your permissions")
    parser.add_argument("--references", choices=REFERENCE_POLICIES, default="zero",
                        help="an exercise whose code is, wraps or calls a course reference (the checks' own "
                             "implementations): zero (default) scores 0 with a note; note only notes it")
    parser.add_argument("--one-process", action="store_true",
                        help="grade every workbook in one guarded process, the learner's code beside the checks "
                             "(the older way; default: the split workbooks' checks in a process of their own)")
    parser.add_argument("--memory-limit", type=int, default=8192, help="address-space cap per child, MiB (default 8192)")
    parser.add_argument("--max-output", type=int, default=65536, help="characters of a check's output kept (default 65536)")
    parser.add_argument("--lessons", type=Path, default=None,
                        help="folder of the lesson notebooks the feedback pages link to "
                             "(default: notebooks/ next to the manifest's folder)")
    parser.add_argument("--require-full-marks", action="store_true",
                        help="exit with status 3 unless every learner scores every point (e.g. grading the course's "
                             "own solutions on your machine before grading a class: make grade-solutions)")
    args = parser.parse_args(argv)
    if args.cell_timeout <= 0 or args.learner_timeout <= 0:
        parser.error("timeouts must be positive")
    holder: dict = {}

    def interrupted(signum, frame):
        holder["signal"] = signum
        if "grader" in holder:
            holder["grader"].stop()

    previous = {s: signal.signal(s, interrupted) for s in (signal.SIGTERM, signal.SIGINT)} \
        if threading.current_thread() is threading.main_thread() else {}  # fmt: skip
    try:
        manifest = Manifest.load(args.manifest)
        if args.sandbox == "none":
            print("warning: learners' code runs without a sandbox (--sandbox none): it can read and write what "
                  "your account can; grade untrusted work in a container (README)", file=sys.stderr)  # fmt: skip
        grades = grade_class(
            args.submissions, manifest, cell_timeout=args.cell_timeout, learner_timeout=args.learner_timeout,
            jobs=args.jobs, reports=args.out.parent / "reports", out=args.out, sandbox=args.sandbox,
            memory_mb=args.memory_limit, max_output=args.max_output, on_start=lambda g: holder.update(grader=g),
            references=args.references, split=not args.one_process,
        )  # fmt: skip
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    lessons = args.lessons if args.lessons is not None else Path(args.manifest).resolve().parent.parent / "notebooks"
    try:
        pages = write_pages(grades, manifest, args.out.parent, lessons if lessons.is_dir() else None)
    except Exception as exc:  # the CSV and the reports are written: say so, and fail at the end
        pages = None
        print(f"error: the feedback pages could not be written ({type(exc).__name__}: {exc})", file=sys.stderr)
    print(f"graded {len(grades)} learner(s) out of {manifest.total_points} points -> {args.out}")
    for grade in grades:
        print(f"  {grade.learner}: {grade.total}/{manifest.total_points}" + (" (see notes)" if grade.notes else ""))
    if pages is not None:
        print(f"feedback pages: {pages.class_page} (the class) and {len(pages.learner_pages)} in "
              f"{pages.class_page.parent / 'learners'} (one per learner)")
    if "signal" in holder:
        print(f"interrupted by {_signal_name(holder['signal'])}: unfinished learners are noted", file=sys.stderr)
        return 128 + holder["signal"]
    short = [g for g in grades if g.total != manifest.total_points]
    if args.require_full_marks and (short or not grades):
        for grade in short:
            print(f"not full marks: {grade.learner} {grade.total}/{manifest.total_points}"
                  + (f" ({'; '.join(grade.notes)})" if grade.notes else "") + f"; details in {args.out.parent / 'reports'}",
                  file=sys.stderr)
        if not grades:
            print("not full marks: no learner was graded", file=sys.stderr)
        return 3
    return 0 if pages is not None else 2


if __name__ == "__main__":
    sys.exit(main())
