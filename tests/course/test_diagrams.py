"""Tests of adam8lib.course.diagrams: the drawn numbers are the library's numbers."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from adam8lib.course.checks.ex05_dynamic_map import decode_fields  # noqa: E402
from adam8lib.course.diagrams import (  # noqa: E402
    STEP_GRAPH, code_bit_roles, draw_blocks, draw_code_bits, draw_memory_bill, draw_step_dataflow, memory_bill)
from adam8lib.memory import MB  # noqa: E402
from adam8lib.quant import quantize_blockwise  # noqa: E402


@pytest.mark.parametrize("signed", [True, False])
def test_bit_roles_agree_with_the_decoded_decade_and_fraction(signed):
    for index in range(256):
        roles = code_bit_roles(index, signed)
        assert len(roles) == 8
        sign, decade, fraction, _ = decode_fields(index, signed)
        if sign == 0 or decade == 7:
            assert {r for _, r in roles} == {"special"}
            continue
        kinds = [r for _, r in roles]
        n_fraction = decade if signed else decade + 1
        assert kinds.count("marker") == 1 and kinds.count("fraction") == n_fraction
        assert kinds.count("zero") == (6 - decade if signed else 6 - decade)
        assert int("".join(str(b) for b, r in roles if r == "fraction") or "0", 2) == fraction
        if signed:
            assert roles[0] == (int(sign > 0), "sign")


def test_bit_roles_reject_bad_indices():
    for bad in (-1, 256, 3.0, True):
        with pytest.raises(ValueError):
            code_bit_roles(bad)


def test_draw_code_bits_draws_eight_boxes_per_code():
    fig, ax = plt.subplots()
    rows = draw_code_bits(ax, [128, 200, 127])
    assert len(rows) == 3 and len(ax.patches) == 24
    plt.close(fig)


def test_draw_blocks_returns_the_library_absmax_and_shades_the_tile():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    fig, ax = plt.subplots()
    absmax = draw_blocks(ax, x, 256, rows=2, program=1)
    assert torch.equal(absmax, quantize_blockwise(x, None, 256)[1])
    tile = ax.patches[-1]
    assert tile.get_x() == 512 and tile.get_width() == 1000 - 512  # program 1 owns blocks 2-3 (the ragged one)
    with pytest.raises(ValueError):
        draw_blocks(ax, x, 256, rows=2, program=2)
    plt.close(fig)


def test_step_graph_reads_codes_and_writes_codes_through_registers():
    fig, ax = plt.subplots()
    edges = draw_step_dataflow(ax)
    assert edges is STEP_GRAPH
    targets = {b for _, b in edges}
    sources = {a for a, _ in edges}
    assert {"p ", "codes m, v \n(uint8)", "absmax m, v \n(fp32)"} == targets - sources  # what the step writes
    assert {"codes m, v\n(uint8)", "absmax m, v\n(fp32)", "g", "p"} == sources - targets  # what it reads
    plt.close(fig)


def test_memory_bill_numbers():
    n = 65_783_042
    adamw, eight = memory_bill(n, "adamw"), memory_bill(n, "adam8bit", activations=10 * MB)
    assert adamw.optimizer == 8 * n and adamw.weights == adamw.gradients == 4 * n
    assert eight.optimizer == 2 * n + 8 * (-(-n // 256)) and eight.total == 8 * n + eight.optimizer + 10 * MB
    fig, ax = plt.subplots()
    assert draw_memory_bill(ax, {"AdamW": adamw, "8-bit": eight})["8-bit"] is eight
    assert len(ax.patches) == 8
    with pytest.raises(ValueError):
        memory_bill(-1, "adamw")
    plt.close(fig)


def test_nibble_packing_draws_the_library_bytes():
    from adam8lib.course.diagrams import draw_nibble_packing
    from adam8lib.formats import pack_nibbles

    fig, ax = plt.subplots()
    codes = [1, 2, 15, 0, 7]
    assert draw_nibble_packing(ax, codes) == pack_nibbles(torch.tensor(codes, dtype=torch.uint8)).tolist() == [18, 240, 112]
    texts = [t.get_text() for t in ax.texts]
    assert "0001 0010\nbyte 0 = 18" in texts and "code 4\n7 = 0111" in texts
    for bad in ([], [16], list(range(13))):
        with pytest.raises(ValueError):
            draw_nibble_packing(ax, bad)
    plt.close(fig)


def test_rank1_draws_the_scale_of_the_format():
    from adam8lib.course.diagrams import draw_rank1
    from adam8lib.formats import rank1_scales

    fig, (a, b) = plt.subplots(1, 2)
    x = torch.randn(5, 7)
    rows, cols = rank1_scales(x)
    assert torch.equal(draw_rank1(a, b, x), torch.minimum(rows[:, None], cols[None, :]))
    assert len(b.texts) == 35 and len(a.texts) == 35 + 5 + 7
    with pytest.raises(ValueError):
        draw_rank1(a, b, torch.randn(3))
    plt.close(fig)
