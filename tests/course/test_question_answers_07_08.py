"""Lessons 07-08's prediction questions whose answers come from the library: the stored answers against it.
(Where each question is asked and revealed is checked for every lesson by test_predict_before_reveal.py.)"""

from __future__ import annotations

import math

import torch

from adam8lib.course.checks.questions import QUESTIONS


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


def test_08e_a_table_of_12_bits_would_need_more_than_one_compare():
    """08.e: with the top 12 bits as the index, more than 10 buckets would hold two or more changes of code (51);
    at 15 and 16 bits none does. Counted from the change points of the binary search itself."""
    from adam8lib.quant import dynamic_map

    q = dynamic_map(signed=True)
    mids = ((q[1:] + q[:-1]) / 2).view(torch.int32).long() & 0xFFFFFFFF  # where nearest_code changes (bar keep-sign at 0)
    def crowded(bits):
        _, counts = torch.unique(mids >> (32 - bits), return_counts=True)
        return int((counts >= 2).sum())
    assert QUESTIONS["08.e"].answer == "c" and crowded(12) > 10 and crowded(15) == crowded(16) == 0
