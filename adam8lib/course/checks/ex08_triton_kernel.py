"""Checks for workbook 08 · Triton kernels (run on a GPU, or on the CPU with ``TRITON_INTERPRET=1``).

The check launches the learner's ``@triton.jit`` kernel, one program per quantization block
(``grid = (number_of_blocks,)``, ``BLOCK = blocksize``), on small inputs with a ragged tail. Inputs
and outputs live inside larger buffers filled with sentinels, so a kernel that reads or writes past
``n`` (no mask) is caught instead of silently corrupting memory.

The kernel is described and launched by course drivers (:mod:`adam8lib.course.grading.drivers.ex08`):
when graded they run in the learner's process on copies of the buffers this module makes and send the
buffers back as plain tensors, which are copied into this module's own and compared here with its own
reference (in a notebook and in the tests the drivers run right here, on the learner's kernel).
"""

from __future__ import annotations

import torch

from ...quant import dequantize_blockwise, dynamic_map, nearest_code, num_blocks, quantize_blockwise
from ..grading.drivers import drive
from ..grading.drivers import ex08 as _drivers
from ._common import ALL_ARGS, assert_close, call, fail, is_stub, passed, require_callable
from ._properties import describe
from ._variants import diagnose

__all__ = ["check_absmax_kernel", "check_dequantize_kernel", "check_quantize_kernel", "check_ema_requantize_kernel"]

_PAD = 512  # sentinel elements after every buffer
_SIZES = [(1000, 256), (256, 256), (5, 64), (4097, 512), (300, 128)]


def _kernel(kernel) -> dict:
    """What the learner's kernel is (said by the course's driver, where the kernel lives): a Triton kernel, and
    launchable here — on a GPU, or on the CPU when it was built in interpreter mode."""
    about = drive(kernel, _drivers.describe_kernel)
    if not about["launchable"]:
        fail(f"{about['name']!r} is not a Triton kernel.",
             hint="decorate the kernel function with @triton.jit (and launch it as kernel[grid](...)).")
    if not about["cuda"] and not about["interpreted"]:
        fail("this kernel was compiled for a GPU, but there is none here.",
             hint="run the setup cell first: on a CPU it sets TRITON_INTERPRET=1, which must be set BEFORE the "
                  f"@triton.jit cell runs (now TRITON_INTERPRET={about['interpret']!r}).")
    return about


def _spec(value, bases: list):
    """A tensor argument as the driver rebuilds it: a view (offset, shape, stride) of the buffer it lives in."""
    if not torch.is_tensor(value):
        return value
    base = value._base if value._base is not None else value
    if not base.is_contiguous() or base.storage_offset() != 0:
        base = value  # sent (and copied back) on its own
    index = next((i for i, b in enumerate(bases) if b is base), None)
    if index is None:
        bases.append(base)
        index = len(bases) - 1
    if base is value:
        return {"buffer": index, "offset": 0, "shape": list(value.shape),
                "stride": list(value.contiguous().stride())}
    return {"buffer": index, "offset": value.storage_offset(), "shape": list(value.shape),
            "stride": list(value.stride())}


def _launch(kernel, about: dict, grid, *args, **kwargs) -> None:
    """Launch the learner's kernel (by the course's driver) on the buffers behind ``args`` / ``kwargs``, which hold
    what it wrote afterwards; a stub's NotImplementedError (wrapped by the interpreter) is named."""
    not_yet = (f"{about['fn_name']} is not implemented yet: replace the `raise NotImplementedError(...)` line in the "
               "exercise cell with the kernel's body, run that cell, then run this check again.")

    def launched(*args, **kwargs):
        bases: list = []
        sent = [_spec(a, bases) for a in args]
        named = {k: _spec(v, bases) for k, v in kwargs.items()}
        return drive(kernel, _drivers.launch, list(grid), [b.detach().clone() for b in bases], sent, named), bases

    launched.__name__ = launched.__qualname__ = f"{about['fn_name']}[grid]"
    try:
        ran, bases = call(launched, *args, may_change=ALL_ARGS, **kwargs)  # a kernel writes into its pointers
    except AssertionError as exc:
        text = str(exc)  # the interpreter wraps the stub's raise: its message names the exercise
        if "NotImplementedError" in text and ("Exercise 08." in text or isinstance(exc.__cause__, NotImplementedError)
                                             and is_stub(exc.__cause__)):
            fail(not_yet)
        raise
    if type(ran) is dict and ran.get("stub") is True:
        fail(not_yet)
    back = ran.get("buffers") if type(ran) is dict else None
    if type(back) is not list or len(back) != len(bases) or not all(
            torch.is_tensor(t) and t.shape == b.shape and t.dtype == b.dtype for t, b in zip(back, bases)):
        fail(f"{about['fn_name']}: the launch did not give back the buffers it was handed.",
             hint="launch the kernel as kernel[grid](...) on the tensors the check passes.")
    with torch.no_grad():
        for mine, theirs in zip(bases, back):
            mine.copy_(theirs)


def _padded(values: torch.Tensor, fill, pad: int = _PAD) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, view): the view holds ``values``; the buffer continues with ``pad`` sentinels."""
    buf = torch.full((values.numel() + pad,), fill, dtype=values.dtype, device=values.device)
    buf[: values.numel()] = values.reshape(-1)
    return buf, buf[: values.numel()]


def _absmax_store_hint(buf: torch.Tensor, nb: int, bs: int, sentinel: float) -> str:
    """What a kernel that wrote past the nb absmax entries did: a store per lane, or at the wrong offset."""
    written = (buf.cpu() != sentinel).nonzero().flatten()
    last = int(written.max()) if written.numel() else 0
    if last >= bs - 1 or written.numel() > nb:
        return (f"your kernel wrote {written.numel()} absmax entries for {nb} blocks (up to index {last}): the store "
                "used one address per lane (absmax_ptr + offs, a BLOCK-wide store). A block has ONE absmax: program "
                "pid stores a single scalar at absmax_ptr + pid (on a GPU such a store writes over other memory).")
    return "program `pid` writes exactly one value, at absmax_ptr + pid (pid = 0 … number of blocks - 1)."


# ---------------------------------------------------------------------------- 08.1
def check_absmax_kernel(absmax_kernel) -> None:
    """``absmax_kernel[(nb,)](x_ptr, absmax_ptr, n, BLOCK=blocksize)`` writes max|x| of each block."""
    require_callable(absmax_kernel, "absmax_kernel")
    about = _kernel(absmax_kernel)
    gen = torch.Generator().manual_seed(8)
    for n, bs in _SIZES:
        x = torch.randn(n, generator=gen)
        nb = num_blocks(n, bs)
        if n % bs:
            x[(nb - 1) * bs:] *= 0.01  # a ragged tail of small values: a fill value of the masked lanes would win
        x[n // 3] = -7.5  # a negative value with the largest magnitude of its block
        if n >= 2 * bs:
            x[bs: 2 * bs] = 0.0  # an all-zero block
        want = quantize_blockwise(x, None, bs)[1]
        _, x_view = _padded(x, 1e6)  # reading past n would see 1e6
        # room for a per-lane store at absmax_ptr + offs (up to nb * bs): caught here instead of corrupting memory
        out_buf, out = _padded(torch.zeros(nb), -1.0, pad=max(_PAD, nb * bs + bs))
        _launch(absmax_kernel, about, (nb,), x_view, out, n, BLOCK=bs)
        what = f"absmax_kernel on {n} values, blocksize {bs} ({nb} blocks)"
        if bool((out_buf[nb:] != -1.0).any()):
            fail(f"{what} wrote past the {nb} absmax entries (one per block).",
                 hint=_absmax_store_hint(out_buf, nb, bs, -1.0))
        blocks = torch.nn.functional.pad(x, (0, nb * bs - n)).view(nb, bs)
        sentinel = torch.cat([x, torch.full((_PAD,), 1e6)])
        shifted = torch.stack([sentinel[b: b + bs].masked_fill(torch.arange(b, b + bs) >= n, 0.0).abs().amax()
                               for b in range(nb)])
        only_first = torch.zeros(nb)
        hint = diagnose(out.cpu(), [
            ("the last block read past the end of x (the values there are 1e6 here): mask the load with "
             "mask=offs < n (strictly less) and other=0.0 — the last block is ragged.",
             lambda: torch.cat([want[:-1], torch.tensor([1e6])])),
            ("the last block's absmax is 1.0: your masked lanes are filled with other=1.0, and that fill takes "
             "part in the max. The lanes past n must not count: other=0.0 (no magnitude is below 0).",
             lambda: torch.cat([want[:-1], want[-1:].clamp(min=1.0)]) if n % bs else None),
            ("you took the max of x itself (tl.max(x), or tl.abs after the max): absmax is the largest MAGNITUDE, "
             "tl.max(tl.abs(x), axis=0) — abs first (here a block's biggest magnitude is -7.5).",
             lambda: blocks.amax(dim=1)),
            ("every program read (almost) block 0: the offsets must start at pid * BLOCK, offs = pid * BLOCK + "
             "tl.arange(0, BLOCK) — not at 0, and not at pid.",
             lambda: blocks[0].abs().amax().expand(nb)),
            ("the offsets start at pid * BLOCK, not at pid: program pid reads elements pid*BLOCK … pid*BLOCK + "
             "BLOCK - 1.", lambda: shifted),
            ("every program stored into absmax[0] (one of them wins): store at absmax_ptr + pid.",
             lambda: torch.cat([out.cpu()[:1], only_first[1:]])
             if nb > 1 and out.cpu()[0] != 0 and bool((out.cpu()[0] == want[1:]).any()) else None),
            ("the grid is 1-D: pid = tl.program_id(0) (axis 0); tl.program_id(1) is always 0, so only block 0 "
             "was computed.", lambda: torch.cat([want[:1], only_first[1:]])),
            ("nothing was written into absmax: end the kernel with tl.store(absmax_ptr + pid, block_absmax).",
             lambda: only_first),
        ], "absmax[pid] = max |x| over offsets pid*BLOCK ... pid*BLOCK + BLOCK - 1 (masked at n).", rtol=0, atol=0,
            expected=want)
        assert_close(out.cpu(), want, what=what, hint=hint, rtol=0, atol=0)
    passed("Exercise 08.1 · A Triton absmax-per-block kernel")


# ---------------------------------------------------------------------------- 08.2
def check_dequantize_kernel(dequantize_kernel) -> None:
    """``dequantize_kernel[(nb,)](codes_ptr, absmax_ptr, qmap_ptr, out_ptr, n, BLOCK=blocksize)``."""
    require_callable(dequantize_kernel, "dequantize_kernel")
    about = _kernel(dequantize_kernel)
    gen = torch.Generator().manual_seed(80)
    for signed in (True, False):
        qmap = dynamic_map(signed)
        for n, bs in _SIZES:
            x = torch.randn(n, generator=gen)
            x = x if signed else x.abs()
            if n >= 2 * bs:
                x[:bs] = 0.0  # an all-zero block
            codes, absmax = quantize_blockwise(x, qmap, bs)
            want = dequantize_blockwise(codes, absmax, qmap, bs)
            nb = absmax.numel()
            _, codes_view = _padded(codes, 255)
            absmax_buf, absmax_view = _padded(absmax, 1e6, pad=max(_PAD, n))  # room for absmax_ptr + offs
            out_buf, out = _padded(torch.zeros(n), -12345.0)
            _launch(dequantize_kernel, about, (nb,), codes_view, absmax_view, qmap.clone(), out, n, BLOCK=bs)
            what = f"dequantize_kernel on {n} codes, blocksize {bs} ({nb} blocks, {'signed' if signed else 'unsigned'} map)"
            if bool((out_buf[n:] != -12345.0).any()):
                fail(f"{what} wrote past the end of the output.",
                     hint="mask the store (and the loads): mask = offs < n — the last block is ragged.")
            idx = torch.arange(n)
            values = qmap[codes.long()]
            hint = diagnose(out.cpu(), [
                ("you multiplied the codes themselves: look them up in the map first, tl.load(qmap_ptr + codes) "
                 "(codes are indices, not values).",
                 lambda: codes.float() * absmax[idx // bs]),
                ("you forgot the scale: qmap[codes] is the normalized value; multiply it by the block's absmax, "
                 "tl.load(absmax_ptr + pid).", lambda: values),
                ("one absmax per block: program pid uses absmax[pid], not absmax[0] (tl.load(absmax_ptr + pid)).",
                 lambda: values * absmax[0]),
                ("you divided by absmax: quantizing divided by it, dequantizing multiplies.",
                 lambda: values / absmax[idx // bs]),
                ("the offsets start at pid * BLOCK, not at pid: offs = pid * BLOCK + tl.arange(0, BLOCK).",
                 lambda: torch.where(idx < nb - 1 + bs, values * absmax[idx.clamp(max=nb - 1)], 0.0)),
                ("absmax has one entry per BLOCK: load the single scale tl.load(absmax_ptr + pid), not "
                 "absmax_ptr + offs (that reads one 'absmax' per element).",
                 lambda: values * absmax_buf.cpu()[:n]),
            ], "out[i] = qmap[codes[i]] * absmax[pid] for offsets i = pid*BLOCK + tl.arange(0, BLOCK) (masked).",
                rtol=1e-6, atol=0, expected=want, blocksize=bs)
            assert_close(out.cpu(), want, what=what, hint=hint, rtol=1e-6, atol=0)
    passed("Exercise 08.2 · A Triton blockwise dequantization kernel")


def _codes_report(got: torch.Tensor, want: torch.Tensor, qmap: torch.Tensor, x: torch.Tensor) -> str:
    bad = (got.long() != want.long()).nonzero().flatten()
    i = int(bad[0])
    return (f"{bad.numel()} of {want.numel()} codes differ; first at {i}: x/absmax = {float(x[i]):.6g}, "
            f"got code {int(got[i])} (map value {float(qmap[int(got[i])]):.6g}), "
            f"expected {int(want[i])} (map value {float(qmap[int(want[i])]):.6g})")


# ---------------------------------------------------------------------------- 08.3
def check_quantize_kernel(quantize_kernel) -> None:
    """``quantize_kernel[(nb,)](x_ptr, absmax_ptr, qmap_ptr, codes_ptr, n, BLOCK=blocksize)``: nearest codes."""
    require_callable(quantize_kernel, "quantize_kernel")
    about = _kernel(quantize_kernel)
    gen = torch.Generator().manual_seed(83)
    for signed in (True, False):
        qmap = dynamic_map(signed)
        for n, bs in _SIZES[:4]:
            x = torch.randn(n, generator=gen) * torch.rand(n, generator=gen) ** 4
            x = x if signed else x.abs()
            if n >= 2 * bs:
                x[:bs] = 0.0  # an all-zero block: absmax 0
            want, absmax = quantize_blockwise(x, qmap, bs)
            nb = absmax.numel()
            if n >= 3 * bs:  # exact ties between two map entries, in a block whose absmax is 1
                x[bs: 2 * bs] = 0.0
                x[bs] = 1.0
                x[bs + 1: bs + 9] = (qmap[200:208] + qmap[201:209]) / 2
                want, absmax = quantize_blockwise(x, qmap, bs)
            _, x_view = _padded(x, 0.5)
            _, absmax_view = _padded(absmax, 1e6)
            out_buf, out = _padded(torch.zeros(n, dtype=torch.uint8), 77)
            _, qmap_view = _padded(qmap.clone(), -1e30, pad=16)  # reading qmap[256] finds a huge negative
            _launch(quantize_kernel, about, (nb,), x_view, absmax_view, qmap_view, out, n, BLOCK=bs)
            what = f"quantize_kernel on {n} values, blocksize {bs} ({'signed' if signed else 'unsigned'} map)"
            if bool((out_buf[n:] != 77).any()):
                fail(f"{what} wrote past the end of the codes.", hint="mask the store: tl.store(codes_ptr + offs, codes, mask=offs < n).")
            got = out.cpu()
            if out.dtype != torch.uint8 or torch.equal(got, want):
                continue
            scaled = x / torch.where(absmax > 0, absmax, torch.ones(())).repeat_interleave(bs)[:n]
            report = _codes_report(got, want, qmap, scaled)
            lo = torch.searchsorted(qmap, scaled.contiguous(), right=True).clamp(min=1) - 1  # last entry <= x

            def nearer(below):  # the nearer of qmap[below] and qmap[below + 1], ties to the lower
                above = (below + 1).clamp(max=255)
                return torch.where(qmap[above] - scaled < scaled - qmap[below], above, below)

            rep = absmax.repeat_interleave(bs)[:n]
            hint = diagnose(got.long(), [
                ("an all-zero block has absmax 0: divide by tl.where(absmax > 0, absmax, 1.0), or 0/0 gives NaN, "
                 "every comparison is False and the block gets code 0 instead of the code of 0.0.",
                 lambda: torch.where(rep == 0, 0, want.long())),
                ("on an exact tie between two map entries take the LOWER index: move up only when the upper entry is "
                 "strictly closer (above - x < x - below).",
                 lambda: torch.where((qmap[(lo + 1).clamp(max=255)] - scaled) <= (scaled - qmap[lo]), (lo + 1).clamp(max=255), lo)),
                ("you always kept the lower neighbour: the binary search gives the last entry <= x, but the nearest "
                 "entry is that one or the next: compare both.",
                 lambda: lo),
                ("you always took the upper neighbour lo + 1: the nearest entry is lo or lo + 1, whichever is closer.",
                 lambda: (lo + 1).clamp(max=255)),
                ("the search needs 8 halvings (128, 64, …, 1) to reach all 256 entries: with 7 it never gets past "
                 "index 127.", lambda: nearer(lo.clamp(max=127))),
                ("keep the upper neighbour inside the map, hi = tl.minimum(lo + 1, 255): for x = 1 (an element equal "
                 "to its block's absmax) lo is 255 and lo + 1 reads past the end of qmap.",
                 lambda: torch.where(lo == 255, 0, want.long())),
                ("you multiplied x by absmax: normalise by DIVIDING, x / absmax, so the block's values land in [-1, 1].",
                 lambda: nearest_code(x * rep, qmap).long()),
                ("one absmax per block: program pid uses absmax[pid], not absmax[0] (tl.load(absmax_ptr + pid)).",
                 lambda: nearest_code(x / (absmax[0] if absmax[0] > 0 else 1.0), qmap).long()),
            ], "normalise by the block's absmax, binary-search the sorted map (8 halvings: 128, 64, …, 1), then pick the "
               "nearer of the two neighbours (ties: the lower index).", rtol=0, atol=0, expected=want.long(), x=x,
               blocksize=bs)
            fail(f"{what}: {report}", hint)
        # a uint8 output, not int32 written into a uint8 buffer by accident
    passed("Exercise 08.3 · A Triton nearest-code kernel (binary search)")


# ---------------------------------------------------------------------------- 08.4
def ema_requantize_reference(codes, absmax, g, qmap, beta, blocksize):
    """The fused 8-bit EMA of one state: dequantize, m = beta m + (1 - beta) g in fp32, new absmax, requantize."""
    m = dequantize_blockwise(codes, absmax, qmap, blocksize)
    b = torch.tensor(beta, dtype=torch.float32)
    m = b * m + (1 - b) * g
    return quantize_blockwise(m, qmap, blocksize)


def check_ema_requantize_kernel(ema_requantize_kernel) -> None:
    """``ema_requantize_kernel[(nb,)](codes_ptr, absmax_ptr, g_ptr, qmap_ptr, n, beta, BLOCK=blocksize)``, in place."""
    require_callable(ema_requantize_kernel, "ema_requantize_kernel")
    about = _kernel(ema_requantize_kernel)
    gen = torch.Generator().manual_seed(84)
    qmap = dynamic_map(True)
    cases = []
    for n, bs in _SIZES[:4]:
        m0 = torch.randn(n, generator=gen) * 0.01
        codes, absmax = quantize_blockwise(m0, qmap, bs)
        g = torch.randn(n, generator=gen) * 0.02
        if n >= 2 * bs:
            codes[:bs], absmax[0], g[:bs] = 127, 0.0, 0.0  # a block that stays all zero
        cases.append((f"ema_requantize_kernel on {n} values, blocksize {bs}", codes, absmax, g, 0.9, bs))
    # exact ties: block 1 starts at 0 (absmax 0) and beta = 0.5, so m = 0.5 * g exactly and m / absmax_new = g,
    # which holds the exact midpoints between map entries 200 … 208 (and 1.0, the block's largest value)
    n, bs = 300, 128
    codes, absmax = quantize_blockwise(torch.randn(n, generator=gen) * 0.01, qmap, bs)
    g = torch.randn(n, generator=gen) * 0.02
    codes[bs: 2 * bs], absmax[1], g[bs: 2 * bs] = 127, 0.0, 0.0
    g[bs], g[bs + 1: bs + 9] = 1.0, (qmap[200:208] + qmap[201:209]) / 2
    cases.append((f"ema_requantize_kernel on {n} values, blocksize {bs}, beta 0.5, with values exactly halfway "
                  "between two map entries", codes, absmax, g, 0.5, bs))
    for what, codes, absmax, g, beta, bs in cases:
        n = codes.numel()
        want_codes, want_absmax = ema_requantize_reference(codes, absmax, g, qmap, beta, bs)
        nb = absmax.numel()
        codes_buf, codes_view = _padded(codes, 0)
        # room for a per-lane absmax store (absmax_ptr + offs reaches nb * bs): caught, not a corrupted process
        absmax_buf, absmax_view = _padded(absmax, 1e6, pad=max(_PAD, nb * bs + bs))
        _, g_view = _padded(g, 1e3)
        _launch(ema_requantize_kernel, about, (nb,), codes_view, absmax_view, g_view, qmap.clone(), n, beta, BLOCK=bs)
        if bool((absmax_buf[nb:] != 1e6).any()):
            fail(f"{what} wrote past the {nb} absmax entries.", hint=_absmax_store_hint(absmax_buf, nb, bs, 1e6))
        if bool((codes_buf[n:] != 0).any()):
            fail(f"{what} wrote past the end of the codes.",
                 hint="mask the code store with offs < n: the last block is partial (n is not a multiple of BLOCK).")
        got_codes, got_absmax = codes_view.cpu(), absmax_view.cpu()
        m_old = dequantize_blockwise(codes, absmax, qmap, bs)
        m_new = m_old * beta + (1 - beta) * g
        blocks = torch.nn.functional.pad(m_new, (0, nb * bs - n)).view(nb, bs)
        tail = torch.cat([m_new, qmap[0] * absmax[-1] * beta + torch.zeros(nb * bs - n)]).view(nb, bs)

        def block_absmax(m):
            return torch.nn.functional.pad(m, (0, nb * bs - n)).view(nb, bs).abs().amax(1)

        def close_codes(a, b):
            d = (a.long() - b.long()).abs()
            return bool(d.max() <= 1 and (d > 0).float().mean() <= 0.002)

        if torch.equal(got_absmax, absmax) and not torch.equal(absmax, want_absmax) and close_codes(got_codes, want_codes):
            fail(f"{what}: the absmax did not change (the codes did)",
                 "you did not store the new absmax: the codes are normalised by it, so write it back too, "
                 "tl.store(absmax_ptr + pid, new_absmax).")
        hint = diagnose(got_absmax, [
            ("masked lanes must not count in the new absmax: set them to 0 (m = tl.where(mask, m, 0.0)) before "
             "tl.max — a masked code load with other=0 reads map entry 0 = -0.99 * absmax.",
             lambda: tail.abs().amax(1)),
            ("you took tl.max(m), the largest value: the new absmax is the largest MAGNITUDE of the updated state, "
             "tl.max(tl.abs(m), axis=0).",
             lambda: blocks.amax(1)),
            ("you kept the old absmax: the new absmax is taken AFTER the update (m = beta * m + (1 - beta) * g), "
             "not from the old state.",
             lambda: absmax),
            ("beta multiplies the OLD state: m = beta * m + (1 - beta) * g (you swapped beta and 1 - beta).",
             lambda: block_absmax((1 - beta) * m_old + beta * g)),
            ("dequantize first: m = qmap[codes] * absmax[pid] — qmap[codes] alone is the normalised value in "
             "[-1, 1], not the state.",
             lambda: block_absmax(beta * qmap[codes.long()] + (1 - beta) * g)),
        ], "absmax[pid] = max |beta * m + (1 - beta) * g| over the block's valid elements.", rtol=1e-6, atol=0,
            expected=want_absmax)
        assert_close(got_absmax, want_absmax, what=f"{what}: the new absmax", hint=hint, rtol=1e-6, atol=0)
        if not close_codes(got_codes, want_codes):
            scaled = m_new / torch.where(want_absmax > 0, want_absmax, torch.ones(())).repeat_interleave(bs)[:n]
            rep_old = torch.where(absmax > 0, absmax, torch.ones(())).repeat_interleave(bs)[:n]
            zero = (want_absmax == 0).repeat_interleave(bs)[:n]
            hint = "requantize the updated state with the NEW absmax: nearest code of m / absmax_new (your 08.3 search)."
            lo = torch.searchsorted(qmap, scaled.contiguous(), right=True).clamp(min=1) - 1
            up = (lo + 1).clamp(max=255)
            ties_up = torch.where((qmap[up] - scaled) <= (scaled - qmap[lo]), up, lo)
            if close_codes(got_codes, ties_up) and not torch.equal(ties_up.long(), want_codes.long()):
                hint = ("on an exact tie between two map entries (a value exactly halfway) take the LOWER index: move "
                        "up only when the upper entry is strictly closer (above - x < x - below), as in 08.3.")
            elif close_codes(got_codes, lo):
                hint = ("you always kept the lower neighbour (the last map entry <= x): the nearest code is that entry "
                        "or the next one, whichever is closer.")
            elif close_codes(got_codes, nearest_code(m_new / rep_old, qmap)):
                hint = ("you normalised by the OLD absmax: requantize m / new_absmax (the absmax you store), so the "
                        "codes and the stored scale agree.")
            elif bool(zero.any()) and not torch.equal(got_codes[zero], want_codes[zero]) and \
                    torch.equal(got_codes[~zero], want_codes[~zero]):
                hint = ("an all-zero block has absmax 0: divide by tl.where(absmax > 0, absmax, 1.0), or 0/0 gives "
                        "NaN and the block gets code 0 instead of the code of 0.0.")
            elif hint.startswith("requantize the updated state"):
                found = describe(got_codes.long(), want_codes.long(), blocksize=bs, rtol=0, atol=0)
                hint = f"the codes: {found}. The rule: {hint}" if found else hint
            fail(f"{what}: {_codes_report(got_codes, want_codes, qmap, scaled)}", hint)
    passed("Exercise 08.4 · A fused 8-bit EMA kernel")
