"""The README's grading section names the workbooks that really run in one guarded process (issue 53:
workbook 14 was left out of the list)."""

from __future__ import annotations

import re
from pathlib import Path

from adam8lib.course.grading import checker
from adam8lib.course.grading.conventions import MANIFEST_NAME, Manifest

REPO = Path(__file__).resolve().parents[2]


def _numbers(text: str) -> list[str]:
    return re.findall(r"\d\d", text)


def test_the_readme_lists_every_one_process_workbook():
    manifest = Manifest.load(REPO / "exercises" / MANIFEST_NAME)
    one_process = sorted(name[:2] for name in set(manifest.notebooks) - set(checker.SPLIT))
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    if not one_process:  # every workbook is split: the README says so, and names what one process leaves open
        assert "No workbook of the course is graded in one guarded process" in readme
        assert "what is **not** prevented: with `--one-process`" in readme
        return
    listed = re.search(r"Workbooks \*\*([\d, and]+)\*\* are still graded in one guarded", readme)
    assert listed, "the README no longer says which workbooks are graded in one process"
    assert _numbers(listed.group(1)) == one_process, (listed.group(1), one_process)
    not_prevented = re.search(r"what is \*\*not\*\* prevented: in workbooks ([\d, and]+) the learner's code", readme)
    assert not_prevented and _numbers(not_prevented.group(1)) == one_process, not_prevented
