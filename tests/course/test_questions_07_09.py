"""Lessons 07-09's prediction questions: the new answers against the library, and predict-before-reveal order."""

from __future__ import annotations

import math
from pathlib import Path

import nbformat
import pytest
import torch

from adam8lib.course.checks.questions import QUESTIONS

REPO = Path(__file__).resolve().parents[2]
LESSONS = ("07_adam8bit_step.ipynb", "08_triton_kernel.ipynb", "09_memory_maths.ipynb")


def test_07d_and_07e_agree_with_the_stale_v_experiment():
    from adam8lib.stale import stale_v_block

    run = stale_v_block()
    assert QUESTIONS["07.d"].is_right(int(run.codes_changed[run.stop:run.resume].sum()))
    assert QUESTIONS["07.e"].is_right(run.v_ratio[run.resume - 1].item())
    assert math.isclose(QUESTIONS["07.e"].answer, (1 - 0.999**3000) / (1 - 0.999**1000) / 0.999**2000, rel_tol=0.01)


def test_08d_the_code_table_equals_the_binary_search():
    from adam8lib.kernels.code_table import code_table
    from adam8lib.quant import dynamic_map, nearest_code

    q = dynamic_map(signed=True)
    table = code_table(q, keep_sign=True).raw_steps.long()
    torch.manual_seed(1)
    x = torch.cat([torch.randn(100_000) * torch.rand(100_000) ** 6, q, -q, torch.tensor([0.0, -0.0, float("nan")])])
    bits = x.view(torch.int32).long() & 0xFFFFFFFF
    entry = table[bits >> 16] & 0xFFFFFFFF
    codes = torch.where(((bits << 16) & 0xFFFFFFFF) > entry, (entry >> 8) & 0xFF, entry & 0xFF)
    assert QUESTIONS["08.d"].answer == int((codes != nearest_code(x, q, keep_sign=True).long()).sum()) == 0


@pytest.mark.parametrize("name", LESSONS)
def test_each_prediction_comes_before_its_reveal_and_the_reveal_is_collapsed(name):
    cells = nbformat.read(str(REPO / "notebooks" / name), as_version=4).cells
    predicts = {c.metadata["adam8"]["predicts"]: i for i, c in enumerate(cells)
                if "predicts" in c.metadata.get("adam8", {})}
    reveals = {c.metadata["adam8"]["reveals"]: i for i, c in enumerate(cells)
               if "reveals" in c.metadata.get("adam8", {})}
    assert len(reveals) >= 2 and set(reveals) <= set(predicts), (predicts, reveals)
    for qid, at in reveals.items():
        cell = cells[at]
        assert predicts[qid] < at, qid
        assert f'reveal("{qid}"' in cell.source and f'ask("{qid}"' in cells[predicts[qid]].source
        assert cell.metadata["jupyter"]["outputs_hidden"] is True
        assert QUESTIONS[qid].display() in "".join(o.get("text", "") for o in cell.outputs)
    recap = [i for i, c in enumerate(cells) if c.cell_type == "markdown" and c.source.startswith("## Recap")]
    unrevealed = [i for q, i in predicts.items() if q not in reveals]
    assert all(recap and i > recap[0] for i in unrevealed), (recap, unrevealed)
