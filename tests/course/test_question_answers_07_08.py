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


def test_08b_the_unfused_reference_step_moves_more_than_200_bytes_per_parameter():
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from adam8lib.kernels.reference import adam8bit_step
    from adam8lib.quant import dynamic_map, num_blocks

    class Traffic(TorchDispatchMode):  # lesson 08's counter: every aten op's tensors, views skipped
        def __init__(self):
            super().__init__()
            self.ops, self.nbytes, self.by_op = 0, 0, Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns):
                return out
            self.ops += 1
            for t in tree_flatten((args, kwargs))[0] + tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.nbytes += t.numel() * t.element_size()
                    self.by_op[func.overloadpacket.__name__] += t.numel() * t.element_size()
            return out

    n = 100_003
    torch.manual_seed(0)
    p, g = torch.randn(n) * 0.1, torch.randn(n) * 0.01
    states = [torch.full((n,), 127, dtype=torch.uint8), torch.zeros(n, dtype=torch.uint8),
              torch.zeros(num_blocks(n, 256)), torch.zeros(num_blocks(n, 256))]
    with Traffic() as traffic:
        adam8bit_step(p, g, *states, dynamic_map(True), dynamic_map(False), step=1, lr=1e-3, beta1=0.9,
                      beta2=0.999, eps=1e-8, weight_decay=0.01, blocksize=256)
    per_param = traffic.nbytes / n
    assert QUESTIONS["08.b"].is_right("c") and not QUESTIONS["08.b"].is_right("b")
    assert per_param > 200 and round(per_param, -1) == 810 and traffic.ops == 192  # the explanation's figures
    top = dict(traffic.by_op.most_common(2))
    assert round(top["sub"] / n) == 128 and round(top["index"] / n) == 120
