"""Diagrams drawn from code for the lessons (matplotlib): what a code's bits mean, how blocks and
the Triton tile cut a tensor, the data flow of one 8-bit step, and the memory bill of training.

Each ``draw_*`` function draws on a given ``ax`` and returns what it drew (fields, absmax, the
graph, the bill) so the numbers in the picture are the numbers a test can check.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..memory import MB, estimate_optimizer_memory
from ..quant import num_blocks

__all__ = ["code_bit_roles", "draw_code_bits", "draw_blocks", "STEP_GRAPH", "draw_step_dataflow", "Bill",
           "memory_bill", "draw_memory_bill"]

ROLE_COLORS = {"sign": "#d62728", "zero": "#bcbcbc", "marker": "#1f77b4", "fraction": "#2ca02c", "special": "#ff7f0e"}


def code_bit_roles(index: int, signed: bool = True) -> list[tuple[int, str]]:
    """The 8 bits of map entry ``index`` read as a dynamic tree code, most significant first.

    Signed: a sign bit (1 = positive), then the 7-bit tree code ``j + 1`` (``j`` counts the
    entries of that sign from the smallest magnitude): ``6 - decade`` zeros, a marker 1, and
    ``decade`` fraction bits. Unsigned: the 8-bit tree code ``j + 2`` — one more fraction bit.
    The codes of 0.0 and 1.0 are special (role ``"special"`` on every bit).
    """
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index <= 255:
        raise ValueError(f"index must be an int in 0..255, got {index!r}")
    if index == 255 or index == (127 if signed else 0):
        return [((index >> (7 - i)) & 1, "special") for i in range(8)]
    if signed:
        positive = index > 127
        tree = (index - 128 if positive else 126 - index) + 1
        bits = [(int(positive), "sign")]
        width = 7
    else:
        tree, bits, width = index + 1, [], 8
    pattern = [(tree >> (width - 1 - i)) & 1 for i in range(width)]
    lead = pattern.index(1)
    for i, b in enumerate(pattern):
        bits.append((b, "zero" if i < lead else "marker" if i == lead else "fraction"))
    return bits


def draw_code_bits(ax, indices, signed: bool = True, qmap: torch.Tensor | None = None) -> list[list[tuple[int, str]]]:
    """One row of 8 coloured bit boxes per map index, labelled with the entry's value."""
    from ..quant import dynamic_map
    from matplotlib.patches import Patch, Rectangle

    indices = list(indices)
    if not indices:
        raise ValueError("give at least one index")
    qmap = dynamic_map(signed) if qmap is None else qmap
    rows = []
    for r, index in enumerate(indices):
        roles = code_bit_roles(index, signed)
        y = len(indices) - 1 - r
        for c, (bit, role) in enumerate(roles):
            ax.add_patch(Rectangle((c, y + 0.1), 0.95, 0.8, color=ROLE_COLORS[role], alpha=0.85))
            ax.text(c + 0.47, y + 0.5, str(bit), ha="center", va="center", fontsize=12, color="white", weight="bold")
        ax.text(8.2, y + 0.5, f"index {index:3d} → {float(qmap[index]):+.4g}", va="center", fontsize=9, family="monospace")
        rows.append(roles)
    ax.set(xlim=(0, 12), ylim=(0, len(indices)), xticks=[], yticks=[],
           title=f"{'signed' if signed else 'unsigned'} dynamic map: a code read as bits")
    for side in ax.spines.values():
        side.set_visible(False)
    ax.legend(handles=[Patch(color=ROLE_COLORS[k], label=lab) for k, lab in
                       [("sign", "sign"), ("zero", "zeros = 6 - decade"), ("marker", "marker 1"),
                        ("fraction", "fraction bits"), ("special", "0.0 / 1.0")]],
              loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=5, fontsize=8, frameon=False)
    return rows


def draw_blocks(ax, x: torch.Tensor, blocksize: int, rows: int = 1, program: int = 0) -> torch.Tensor:
    """|x| along the flat index, block boundaries, each block's absmax, and the tile of ``program``.

    A Triton program of lesson 08 owns ``rows`` whole blocks (a ``[rows, blocksize]`` tile).
    Returns the absmax per block.
    """
    from matplotlib.patches import Rectangle

    x = x.detach().flatten().float().cpu()
    n = x.numel()
    if n == 0 or blocksize < 1 or rows < 1:
        raise ValueError("need a non-empty x, blocksize >= 1 and rows >= 1")
    nb = num_blocks(n, blocksize)
    programs = -(-nb // rows)
    if not 0 <= program < programs:
        raise ValueError(f"program must be in 0..{programs - 1}, got {program}")
    absmax = torch.nn.functional.pad(x.abs(), (0, nb * blocksize - n)).view(nb, blocksize).amax(1)
    ax.plot(range(n), x.abs(), ".", ms=2, color="#7f7f7f", label="|x|")
    for b in range(nb):
        lo, hi = b * blocksize, min(n, (b + 1) * blocksize)
        ax.hlines(float(absmax[b]), lo, hi, color="#d62728", lw=2, label="absmax of the block" if b == 0 else None)
        if b:
            ax.axvline(lo, color="k", lw=0.6, ls=":")
    lo, hi = program * rows * blocksize, min(n, (program + 1) * rows * blocksize)
    top = float(absmax.max()) * 1.1 or 1.0
    ax.add_patch(Rectangle((lo, 0), hi - lo, top, color="#1f77b4", alpha=0.12,
                           label=f"tile of program {program}: [{rows}, {blocksize}]"))
    ax.set(xlabel="flat index", ylabel="|x|", xlim=(0, nb * blocksize), ylim=(0, top),
           title=f"{n} values, {nb} blocks of {blocksize}, {programs} programs")
    ax.legend(fontsize=8, loc="upper left")
    return absmax


#: One 8-bit step as a graph: (source, target). Nodes in memory between steps: codes, absmax, p, g.
STEP_GRAPH: list[tuple[str, str]] = [
    ("codes m, v\n(uint8)", "dequantize"), ("absmax m, v\n(fp32)", "dequantize"),
    ("dequantize", "m, v (fp32)"), ("g", "EMA"), ("m, v (fp32)", "EMA"), ("EMA", "update"),
    ("p", "update"), ("update", "p "), ("EMA", "new absmax"), ("new absmax", "requantize"),
    ("EMA", "requantize"), ("requantize", "codes m, v \n(uint8)"), ("new absmax", "absmax m, v \n(fp32)"),
]
_MEMORY = {"codes m, v\n(uint8)", "absmax m, v\n(fp32)", "g", "p", "p ", "codes m, v \n(uint8)", "absmax m, v \n(fp32)"}
_POS = {"codes m, v\n(uint8)": (0, 3), "absmax m, v\n(fp32)": (0, 2), "g": (0, 1), "p": (0, 0),
        "dequantize": (1.6, 2.5), "m, v (fp32)": (3.0, 2.5), "EMA": (4.4, 2.0), "update": (5.8, 0.5),
        "p ": (7.4, 0), "new absmax": (5.8, 2.6), "requantize": (5.8, 3.5),
        "codes m, v \n(uint8)": (7.4, 3.5), "absmax m, v \n(fp32)": (7.4, 2.4)}


def draw_step_dataflow(ax) -> list[tuple[str, str]]:
    """The data flow of one fused 8-bit step: memory (grey) on the edges, registers (blue) inside."""
    boxes = {}
    for name, (x, y) in _POS.items():
        memory = name in _MEMORY
        boxes[name] = ax.text(x, y, name.strip(), ha="center", va="center", fontsize=8, zorder=3,
                              bbox=dict(boxstyle="round,pad=0.4", fc="#e0e0e0" if memory else "#cfe2f3",
                                        ec="#7f7f7f" if memory else "#1f77b4"))
    ax.figure.canvas.draw()  # lay the boxes out, so arrows can end at their edges
    for (a, b) in STEP_GRAPH:
        ta, tb = boxes[a], boxes[b]
        ax.annotate("", xy=(0.5, 0.5), xycoords=tb, xytext=(0.5, 0.5), textcoords=ta, zorder=2,
                    arrowprops=dict(arrowstyle="-|>", color="#555", lw=1.1, shrinkA=1, shrinkB=1,
                                    patchA=ta.get_bbox_patch(), patchB=tb.get_bbox_patch()))
    ax.axvspan(0.8, 6.6, color="#1f77b4", alpha=0.05)
    ax.text(3.7, -0.7, "inside the kernel: registers, fp32", ha="center", fontsize=9, color="#1f77b4")
    ax.text(0, -0.7, "memory (read)", ha="center", fontsize=9, color="#555")
    ax.text(7.4, -0.7, "memory (written)", ha="center", fontsize=9, color="#555")
    ax.set(xlim=(-0.8, 8.3), ylim=(-1.0, 4.0), xticks=[], yticks=[], title="one 8-bit Adam step, fused")
    for side in ax.spines.values():
        side.set_visible(False)
    return STEP_GRAPH


@dataclass(frozen=True)
class Bill:
    """Bytes of one training step's memory, by item."""

    weights: int
    gradients: int
    optimizer: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations


def memory_bill(n_params: int, optimizer: str, *, activations: int = 0, param_bytes: int = 4,
                blocksize: int = 256) -> Bill:
    """Weights and gradients (``param_bytes`` each), the optimizer state, and given activations, in bytes."""
    if n_params < 0 or activations < 0:
        raise ValueError("n_params and activations must be >= 0")
    state = estimate_optimizer_memory(n_params, optimizer, blocksize=blocksize, min_8bit_size=0).total_bytes
    return Bill(param_bytes * n_params, param_bytes * n_params, int(state), int(activations))


def draw_memory_bill(ax, bills: dict[str, Bill]) -> dict[str, Bill]:
    """Horizontal stacked bars of each bill in MiB, item by item, with the total at the end."""
    if not bills:
        raise ValueError("give at least one bill")
    colors = {"weights": "#7f7f7f", "gradients": "#bcbcbc", "optimizer": "#d62728", "activations": "#1f77b4"}
    for row, (label, bill) in enumerate(bills.items()):
        left = 0.0
        for item, color in colors.items():
            width = getattr(bill, item) / MB
            ax.barh(row, width, left=left, color=color, label=item if row == 0 else None)
            if width > 0.06 * (bill.total / MB):
                ax.text(left + width / 2, row, f"{width:.0f}", ha="center", va="center", fontsize=8, color="white")
            left += width
        ax.text(left, row, f"  {left:.0f} MiB", va="center", fontsize=9)
    ax.set_yticks(range(len(bills)), list(bills))
    ax.invert_yaxis()
    ax.set(xlabel="MiB (2**20 bytes)", title="the memory bill of a training step")
    ax.set_xlim(0, max(b.total for b in bills.values()) / MB * 1.2)
    ax.legend(fontsize=8, ncol=4, loc="lower right")
    return bills


def draw_nibble_packing(ax, codes) -> list[int]:
    """Lesson 12: 4-bit codes, two per byte. Draws the codes (top), the bytes they pack into (bottom,
    element ``2i`` in the high nibble), each byte's bits and value. Returns the packed bytes (what
    :func:`adam8lib.formats.pack_nibbles` gives)."""
    from matplotlib.patches import Rectangle

    from ..formats import pack_nibbles

    codes = torch.as_tensor(codes, dtype=torch.uint8).flatten()
    if codes.numel() == 0 or codes.numel() > 12 or bool((codes > 15).any()):
        raise ValueError("draw 1 to 12 codes, each 0..15")
    packed = pack_nibbles(codes).tolist()
    for i, c in enumerate(codes.tolist()):
        ax.add_patch(Rectangle((i, 1.6), 0.92, 0.8, color="#1f77b4" if i % 2 == 0 else "#ff7f0e", alpha=0.25))
        ax.text(i + 0.46, 2.0, f"code {i}\n{c} = {c:04b}", ha="center", va="center", fontsize=8)
        ax.annotate("", xy=(2 * (i // 2) + (0.5 if i % 2 == 0 else 1.4), 0.85), xytext=(i + 0.46, 1.6),
                    arrowprops=dict(arrowstyle="->", lw=0.7, color="#555555"))
    for b, byte in enumerate(packed):
        ax.add_patch(Rectangle((2 * b, 0.05), 0.94, 0.8, color="#1f77b4", alpha=0.35))
        ax.add_patch(Rectangle((2 * b + 0.94, 0.05), 0.94, 0.8, color="#ff7f0e", alpha=0.35))
        ax.text(2 * b + 0.94, 0.45, f"{byte >> 4:04b} {byte & 15:04b}\nbyte {b} = {byte}", ha="center",
                va="center", fontsize=8)
    ax.set(xlim=(-0.2, max(codes.numel(), 2 * len(packed)) + 0.2), ylim=(0, 2.6),
           title=f"{codes.numel()} codes of 4 bits -> {len(packed)} bytes (high nibble: even index)")
    ax.axis("off")
    return packed


def draw_rank1(ax_matrix, ax_scale, x: torch.Tensor) -> torch.Tensor:
    """Lesson 12: rank-1 normalization of a small matrix. Left: |x| with each row's and column's
    maximum; right: the scale ``min(row max, column max)`` of every entry. Returns the scale."""
    x = x.detach().float().cpu()
    if x.dim() != 2 or x.numel() == 0 or max(x.shape) > 16:
        raise ValueError("draw a 2-D matrix of at most 16 x 16")
    a = x.abs()
    rows, cols = a.amax(dim=1), a.amax(dim=0)
    scale = torch.minimum(rows[:, None], cols[None, :])
    top = float(a.max()) or 1.0
    for ax, values, title in ((ax_matrix, a, "|v|, with row and column maxima"),
                              (ax_scale, scale, "scale = min(row max, column max)")):
        ax.imshow(values, cmap="viridis", vmin=0, vmax=top)
        for (i, j), value in ((ij, float(values[ij])) for ij in [(i, j) for i in range(x.shape[0]) for j in range(x.shape[1])]):
            ax.text(j, i, f"{value:.2g}", ha="center", va="center", fontsize=7, color="w" if value < 0.6 * top else "k")
        ax.set(title=title, xticks=[], yticks=[])
    for i, r in enumerate(rows.tolist()):
        ax_matrix.text(x.shape[1] - 0.3, i, f"  {r:.2g}", va="center", fontsize=7, color="#d62728")
    for j, c in enumerate(cols.tolist()):
        ax_matrix.text(j, -0.8, f"{c:.2g}", ha="center", fontsize=7, color="#d62728")
    return scale
