"""Where in the lessons each exercise is taught: the lesson notebook and the section heading.

The feedback pages (:mod:`adam8lib.course.grading.feedback`) send a learner whose check failed
back to the part of the lesson that the exercise practises. A workbook ``NN_topic.ipynb`` goes
with the lesson ``notebooks/NN_topic.ipynb`` (same name); :data:`SECTIONS` names, per exercise
id, the heading of the section (its text as written after the ``#`` marks).

Lessons have no anchors of their own. Jupyter gives every rendered heading an ``id``: its text
with spaces turned into ``-`` (JupyterLab's ``createHeaderId``; nbconvert's HTML also URL-quotes
it, as :func:`heading_anchor` does). A browser shows a ``.ipynb`` file as JSON, so the pages link
to an HTML rendering of each lesson (:func:`render_lessons`, nbconvert's ``lab`` template, written
next to the pages in ``lessons/``): ``../lessons/02_ema.html#Bias-correction`` opens the lesson at
the section in any browser, offline. Where nbconvert cannot render a lesson, the link goes to the
notebook itself (``notebooks/02_ema.ipynb#Bias-correction``, which JupyterLab opens); either way
the page names the lesson and the section in words.
A course test checks that every exercise of the manifest has a section and that the heading
exists in its lesson.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

__all__ = ["SECTIONS", "LessonSection", "heading_anchor", "lesson_file", "lesson_headings", "lesson_section",
           "render_lessons"]

#: exercise id (the check's name without ``check_``) -> heading of the lesson section it practises
SECTIONS: dict[str, str] = {
    # 01 · Optimizer memory
    "state_bytes_per_param": "What is kept",
    "optimizer_state_bytes": "The whole bill for the real DistilBERT",
    "compute_optimizer_size": "The memory bill of training",
    # 02 · Exponential moving averages
    "adam_moments": "These are Adam's moments",
    "bias_correct": "Bias correction",
    # 03 · The Adam rule
    "adam_step": "The rule",
    "adamw_step": "Why decoupling matters",
    # 04 · Linear quantization
    "absmax_quantize": "Absmax int8",
    "absmax_dequantize": "Absmax int8",
    # 05 · The dynamic (tree) map
    "dynamic_map": "The tree map, one decade at a time",
    "nearest_code": "Quantizing with a map",
    "decode_code": "A code, read as bits",
    # 06 · Blockwise quantization
    "quantize_blockwise": "One absmax per block",
    "dequantize_blockwise": "By hand, with a ragged tail",
    # 07 · The 8-bit Adam step
    "adam8bit_step": "One block by hand",
    "adam8bit_optimizer": "The optimizer",
    "stable_embedding": "The stable embedding",
    "trains_like_adam": "`Adam8bit` against bitsandbytes and fp32 Adam",
    # 08 · The Triton kernel
    "absmax_kernel": "Triton in one screen",
    "dequantize_kernel": "The fused step, part by part",
    "quantize_kernel": "The one non-elementwise part: the nearest code",
    "ema_requantize_kernel": "The fused step, part by part",
    # 09 · Memory maths
    "state_megabytes": "The chapter's estimate: 2 bytes per parameter",
    "training_memory": "The whole bill",
    "adamw_state_elements": "Measured",
    "seed_adam8bit": "The chapter's numbers, checked",
    # 10 · Mixed-precision fine-tuning
    "decay_parameter_names": "2 · Which parameters get weight decay?",
    "training_step": "5 · Mixed precision: autocast",
    "trainer_8bit": "6 · `Trainer` with 8-bit Adam",
    "accelerate_epoch": "7 · The same with `accelerate`",
    "amp_step": "5 · Mixed precision: autocast",
    # 11 · 8-bit Adam at scale
    "per_rank_bytes": "7B and 70B on 8 GPUs",
    "shard_range": "What 8-bit states need under FSDP2",
    "local_state_bytes": "What 8-bit states need under FSDP2",
    # 12 · Beyond 8 bits
    "pack_nibbles": "1 · Two codes per byte",
    "zero_point_victims": "3 · The zero-point problem",
    "rank1_scale": "4 · Rank-1 normalization",
    "stochastic_round": "6 · bf16 weights and stochastic rounding",
    # 13 · One state, many optimizers
    "lion8bit": "1 · Five rules, and the states they keep",
    "state_bytes": "6 · The memory table for DistilBERT",
    "lion_flips": "3 · Lion's momentum in 8 bits",
    # 14 · The whole bill
    "release_by_hand": "3 · Gradient release",
    "bill_row": "1 · A tracker that watches every storage",
}

_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$")


def _plain(heading: str) -> str:
    """The text a reader sees: inline code and emphasis marks removed."""
    return re.sub(r"[`*]", "", heading).strip()


def heading_anchor(heading: str) -> str:
    """Jupyter's ``id`` of a rendered heading (spaces -> ``-``), quoted for a URL fragment."""
    return quote(_plain(heading).replace(" ", "-"), safe="-._~!$&'()*+,;=:@?/")


def lesson_headings(path: str | os.PathLike) -> list[str]:
    """The headings of a lesson notebook's markdown cells, in order (empty if it cannot be read)."""
    try:
        stat = os.stat(path)
    except OSError:
        return []
    return list(_headings(os.path.realpath(path), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=64)
def _headings(path: str, _mtime_ns: int, _size: int) -> tuple[str, ...]:
    """Read once per version of the file: a class's pages ask for each lesson many times."""
    try:
        nb = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ()
    found = []
    for cell in nb.get("cells", []) if isinstance(nb, dict) else []:
        if isinstance(cell, dict) and cell.get("cell_type") == "markdown":
            source = cell.get("source", "")
            for line in ("".join(source) if isinstance(source, list) else str(source)).splitlines():
                m = _HEADING.match(line)
                if m:
                    found.append(m.group(1))
    return tuple(found)


@dataclass(frozen=True)
class LessonSection:
    """Where to read again: ``lesson`` (``notebooks/02_ema.ipynb``), the section's heading text,
    ``href`` (relative to the page that links it; None without a local copy of the lessons) and
    ``found`` (the heading is in the local lesson)."""

    lesson: str
    section: str | None
    href: str | None
    found: bool


def render_lessons(notebooks, lessons: Path, out: Path) -> dict[str, Path]:
    """Render the lessons ``lessons/<notebook>`` of ``notebooks`` to ``out/<stem>.html`` (nbconvert,
    ``lab`` template; a rendering newer than its notebook is kept). Returns {notebook: html path} of
    those rendered; a lesson that is missing or that nbconvert cannot render is left out (its links
    then go to the notebook)."""
    try:
        from nbconvert import HTMLExporter
    except ImportError:
        return {}
    exporter, done = None, {}
    for notebook in sorted(set(notebooks)):
        source = Path(lessons) / notebook
        if not source.is_file():
            continue
        target = Path(out) / (Path(notebook).stem + ".html")
        try:
            if not target.is_file() or target.stat().st_mtime_ns < source.stat().st_mtime_ns:
                exporter = exporter or HTMLExporter(template_name="lab")
                body, _ = exporter.from_filename(str(source))
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(target.name + ".tmp")
                tmp.write_text(body, encoding="utf-8")
                os.replace(tmp, target)
        except Exception:  # a lesson nbconvert cannot render: linked as the notebook instead
            continue
        done[notebook] = target
    return done


def lesson_file(notebook: str, lessons: Path | None, page_dir: Path, rendered: dict[str, Path] | None = None
                ) -> LessonSection:
    """The lesson of workbook ``notebook`` as a whole, linked from ``page_dir``: to its HTML rendering
    where ``rendered`` has one (:func:`render_lessons`), else to the notebook."""
    path = Path(lessons) / notebook if lessons is not None else None
    if path is None or not path.is_file():
        return LessonSection(f"notebooks/{notebook}", None, None, False)
    path = (rendered or {}).get(notebook, path)
    href = quote(Path(os.path.relpath(path.resolve(), Path(page_dir).resolve())).as_posix(), safe="/._-~")
    return LessonSection(f"notebooks/{notebook}", None, href, False)


def lesson_section(exercise: str, notebook: str, lessons: Path | None, page_dir: Path,
                   rendered: dict[str, Path] | None = None) -> LessonSection:
    """The lesson section of ``exercise`` (from workbook ``notebook``), linked from ``page_dir``."""
    whole = lesson_file(notebook, lessons, page_dir, rendered)
    heading = SECTIONS.get(exercise)
    if heading is None:
        return whole
    if whole.href is None:
        return LessonSection(whole.lesson, _plain(heading), None, False)
    found = any(_plain(h) == _plain(heading) for h in lesson_headings(Path(lessons) / notebook))
    href = whole.href + ("#" + heading_anchor(heading) if found else "")
    return LessonSection(whole.lesson, _plain(heading), href, found)
