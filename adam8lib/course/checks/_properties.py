"""Which PROPERTY of a wrong result failed, in the learner's terms.

When a learner's result matches none of the usual wrong answers a check knows, the hint can
still say *what kind* of difference it is: the shape (flattened, transposed, a dimension kept or
dropped), the sign, a constant factor or offset, a shift by one position, which blocks are wrong
(only the partial last block, only the first, only the all-zero ones, only the block boundaries),
which inputs (only the negative ones, only zeros, only the absmax element, only NaN/Inf), NaN
where a division by zero happened, codes one off (rounding or ties). :func:`describe` returns one
sentence naming that property, or None when the difference has no simple shape::

    describe(got, want, x=x, blocksize=256)
    # 'only block 3 (elements 768 … 999, the partial last block of 232) is wrong: ...'
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["describe"]


def _as_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.tensor(float(value), dtype=torch.float64)
    return None


def _close(a: torch.Tensor, e: torch.Tensor, rtol: float, atol: float) -> torch.Tensor:
    """Elementwise |a - e| <= atol + rtol |e| (NaN matches NaN)."""
    a, e = a.double(), e.double()
    both_nan = torch.isnan(a) & torch.isnan(e)
    with torch.no_grad():
        ok = (a - e).abs() <= atol + rtol * e.abs()
    return ok | both_nan | (a == e)


_NAMED_FACTORS = [
    (2.0, "twice"), (0.5, "half"), (127.0, "127 times"), (1 / 127, "1/127 of"), (255.0, "255 times"),
    (1 / 255, "1/255 of"), (-1.0, "minus"), (4.0, "4 times"), (0.25, "a quarter of"), (8.0, "8 times"),
    (0.125, "an eighth of"), (1024.0, "1024 times (one KiB/MiB conversion too few?)"),
    (1 / 1024, "1/1024 of (one KiB/MiB conversion too many?)"), (2.0**20, "2**20 times (bytes vs MiB?)"),
    (2.0**-20, "2**-20 of (bytes vs MiB?)"), (2.0**20 / 1e6, "1.048576 times (MB = 10**6 vs MiB = 2**20 bytes?)"),
    (1e6 / 2.0**20, "0.9537 times (MiB = 2**20 vs MB = 10**6 bytes?)"),
]


def _factor_words(c: float, *, only_named: bool = False) -> str | None:
    for value, words in _NAMED_FACTORS:
        if math.isclose(c, value, rel_tol=1e-4):
            return words
    for k in range(3, 65):  # simple integer factors and their inverses: a count off by a factor
        if math.isclose(c, k, rel_tol=1e-6):
            return f"{k} times"
        if math.isclose(c, 1 / k, rel_tol=1e-6):
            return f"1/{k} of"
    return None if only_named else f"{c:.4g} times"


def _describe_number(a: float, e: float) -> str | None:
    """One number against another: only differences that say something (a telling factor, ±1, rounding)."""
    if not (math.isfinite(a) and math.isfinite(e)):
        return f"your result is {a}, expected {e}: a division by zero or an overflow?" if math.isfinite(e) else None
    if e == 0:
        return f"your result is {a:g} where 0 is expected: for this input nothing should be counted"
    if a == 0:
        return "your result is 0 where a non-zero value is expected: a term is missing, or an integer division gave 0"
    if a == -e:
        return "your result has the opposite sign of the expected one"
    c = a / e
    words = _factor_words(c, only_named=True)
    if words:
        return (f"your result is {words} the expected one: the formula is right up to a constant factor (a unit, a "
                "count of states or bytes, a missing or extra division or multiplication)")
    if a - e in (1.0, -1.0):
        return f"your result is the expected one {'plus' if a > e else 'minus'} 1: an off-by-one (a count, a bound)"
    if a == math.floor(e) or a == math.ceil(e) or a == round(e):
        return ("your result is the expected one rounded to a whole number: somewhere an integer division (//), "
                "int() or round() cuts the fraction — use true division /")
    return None


def _shape_property(a: torch.Tensor, e: torch.Tensor, x: torch.Tensor | None) -> str | None:
    sa, se = tuple(a.shape), tuple(e.shape)
    if sa == se:
        return None
    if a.numel() == e.numel():
        if a.dim() == 1 and e.dim() > 1:
            return f"your result is flat, shape {sa}; the expected one keeps the input's shape {se} (reshape it back)"
        if a.dim() == e.dim() and sa == tuple(reversed(se)):
            return f"your result has shape {sa}, the expected {se}: the axes are swapped (transposed)"
        squeezed_a = tuple(d for d in sa if d != 1)
        squeezed_e = tuple(d for d in se if d != 1)
        if squeezed_a == squeezed_e:
            return (f"your result has shape {sa}, the expected {se}: the same values with a size-1 dimension "
                    "added or dropped (keepdim, unsqueeze or squeeze)")
        return f"your result has shape {sa}, the expected {se}: the right number of elements in another shape"
    if x is not None and x.dim() >= 1:
        for dim in range(x.dim()):
            reduced = tuple(s for i, s in enumerate(x.shape) if i != dim)
            kept = tuple(1 if i == dim else s for i, s in enumerate(x.shape))
            if sa in (reduced, kept) and sa != se:
                return (f"your result has shape {sa}: that is the input {tuple(x.shape)} reduced over dimension "
                        f"{dim}; the expected shape {se} reduces over another (or none)")
    if a.dim() == e.dim() == 1 and a.numel() == e.numel() - 1:
        return (f"your result has {a.numel()} entries, one fewer than the {e.numel()} expected: the last (partial) "
                "one is missing — count ceil(n / size), not n // size")
    if a.dim() == e.dim() == 1 and a.numel() == e.numel() + 1:
        return f"your result has {a.numel()} entries, one more than the {e.numel()} expected"
    if a.numel() == 1 and e.numel() > 1:
        return f"your result is a single value, the expected one has shape {se}: one value per {'block' if e.dim() == 1 else 'entry'}"
    return None


def _where(bad: torch.Tensor, x: torch.Tensor | None, blocksize: int | None, x_name: str = "input") -> str | None:
    """Where the wrong elements are: which blocks, which kind of input."""
    flat_bad = bad.reshape(-1)
    n, n_bad = flat_bad.numel(), int(flat_bad.sum())
    if n_bad == 0 or n_bad == n:
        return None
    idx = flat_bad.nonzero().reshape(-1)
    if blocksize and n > blocksize:
        nb = -(-n // blocksize)
        blocks = sorted({int(i) // blocksize for i in idx})
        last_len = n - (nb - 1) * blocksize
        if blocks == [nb - 1]:
            start = (nb - 1) * blocksize
            tail = (f"the partial last block of {last_len}" if last_len < blocksize else "the last block")
            return (f"only block {nb - 1} (elements {start} … {n - 1}, {tail}) is wrong, the others are right: look "
                    "at how your code handles the end of the tensor")
        if blocks == [0]:
            return f"only the first block (elements 0 … {blocksize - 1}) is wrong: look at what block 0 does differently"
        if len(blocks) == nb - 1 and 0 not in blocks:
            return "every block but the first is wrong: block b must use its own offset b * blocksize and its own scale"
        pos = idx % blocksize
        if bool(((pos == 0) | (pos == blocksize - 1) | (idx == n - 1)).all()):
            return ("only elements at the block boundaries (the first or last element of a block) are wrong: an "
                    "off-by-one in where a block starts or ends")
        if x is not None and x.numel() == n:
            xf = x.reshape(-1).double()
            zero_blocks = [b for b in range(nb) if bool((xf[b * blocksize:(b + 1) * blocksize] == 0).all())]
            if zero_blocks and blocks == zero_blocks:
                return (f"only the all-zero block(s) {zero_blocks} are wrong: a block whose absmax is 0 (0 / 0 = NaN) "
                        "needs its own rule")
    if not blocksize and n > 2 and bad.dim() <= 1:
        if idx.tolist() == [n - 1]:
            return (f"only the last entry (index {n - 1}) is wrong, the other {n - 1} are right: look at how your "
                    "code handles the end (a partial last block, a bound n - 1 vs n)")
        if idx.tolist() == [0]:
            return f"only the first entry (index 0) is wrong, the other {n - 1} are right"
    if x is not None and x.numel() == n:
        xf = x.reshape(-1).double()
        kinds = [
            (~torch.isfinite(xf), f"where the {x_name} is NaN or Inf", "those need their own rule"),
            (xf < 0, f"where the {x_name} is negative", "look at how your code treats the sign"),
            (xf > 0, f"where the {x_name} is positive", "look at how your code treats the sign"),
            (xf == 0, f"where the {x_name} is exactly 0", "a zero needs its own care (0 / 0, a sign of 0)"),
        ]
        finite = xf[torch.isfinite(xf)]
        if finite.numel():
            kinds.append((xf.abs() == finite.abs().max(), "at the element of largest magnitude (the absmax itself)",
                          "look at what your code does with the largest value"))
        for mask, words, advice in kinds:
            if bool(mask.any()) and bool((flat_bad <= mask).all()):
                return f"only the elements {words} are wrong ({n_bad} of {n}), the others are right: {advice}"
    return None


def _same_value(a: Any, e: Any, rtol: float, atol: float) -> bool:
    at, et = _as_tensor(a), _as_tensor(e)
    if at is None or et is None:
        return a == e
    return at.shape == et.shape and bool(_close(at.double(), et.double(), rtol, atol).all())


def describe(actual: Any, expected: Any, *, x: Any = None, blocksize: int | None = None, rtol: float = 1e-5,
             atol: float = 1e-6, x_name: str = "input") -> str | None:
    """One sentence naming the property in which ``actual`` differs from ``expected``, or None.

    ``x`` (optional) is the input the result was computed from, elementwise aligned with the result
    when it has the same number of elements; ``blocksize`` names blocks of the flat result."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            return None
        wrong = [k for k in expected if describe(actual[k], expected[k], rtol=rtol, atol=atol) is not None
                 or not _same_value(actual[k], expected[k], rtol, atol)]
        if not wrong:
            return None
        right = [k for k in expected if k not in wrong]
        head = (f"only {', '.join(map(repr, wrong))} {'is' if len(wrong) == 1 else 'are'} wrong "
                f"({', '.join(map(repr, right))} right)") if right else "every entry is wrong"
        found = describe(actual[wrong[0]], expected[wrong[0]], x=x, blocksize=blocksize, rtol=rtol, atol=atol,
                         x_name=x_name)
        if found and found.startswith("your result "):
            found = f"{wrong[0]!r} {found[len('your result '):]}"
        return f"{head}; {found}" if found else head
    if isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            return None
        for i, (a, e) in enumerate(zip(actual, expected)):
            found = describe(a, e, x=x, blocksize=blocksize, rtol=rtol, atol=atol, x_name=x_name)
            if found:
                return f"item {i} of your result: {found}"
        return None
    a, e = _as_tensor(actual), _as_tensor(expected)
    if a is None or e is None:
        return None
    xt = x.detach().cpu() if isinstance(x, torch.Tensor) else None
    shape = _shape_property(a, e, xt)
    if shape or a.shape != e.shape:
        return shape
    if e.numel() == 0 or a.is_complex() or e.is_complex():
        return None
    a64, e64 = a.double(), e.double()
    nonfinite = ~torch.isfinite(a64) & torch.isfinite(e64)
    if bool(nonfinite.any()):
        where = _where(nonfinite, xt, blocksize, x_name)
        first = tuple(int(i) for i in nonfinite.nonzero()[0]) if a64.dim() else ()
        return (f"your result is {a64[first].item()} at index {first} where a finite value is expected"
                + (f" ({where})" if where else "") + ": a division by zero (0 / 0, or x / 0 without eps or a guard)?")
    bad = ~_close(a64, e64, rtol, atol)
    if not bool(bad.any()):
        return None
    if e64.numel() == 1:
        return _describe_number(float(a64.reshape(-1)[0]), float(e64.reshape(-1)[0]))
    if bool((a64 == 0).all()) and bool((e64 != 0).any()):
        return "your result is all zeros: nothing was computed into it (or it was reset, or a factor is 0)"
    if bool(_close(a64, -e64, rtol, atol).all()):
        return "your result has the opposite sign of the expected one everywhere: a sign is flipped"
    if bool(_close(a64, e64.abs(), rtol, atol).all()) and bool((e64 < 0).any()):
        return "your result is the absolute value of the expected one: the sign of the negative entries was lost"
    denom = float((e64 * e64).sum())
    if denom > 0:
        c = float((a64 * e64).sum()) / denom
        words = _factor_words(c)
        if abs(c - 1) > 1e-3 and c != 0 and bool(_close(a64, c * e64, max(rtol, 1e-4), atol).all()):
            return (f"your result is {words} the expected one everywhere: the formula is right up to a constant "
                    "factor (a scale, a unit, a missing or extra division or multiplication)")
    if e64.numel() > 1:
        d = float((a64 - e64).mean())
        if abs(d) > atol and bool(_close(a64, e64 + d, max(rtol, 1e-4), max(atol, 1e-6 * abs(d))).all()):
            return f"your result is the expected one shifted by a constant {d:.4g} everywhere: an offset is wrong"
        fa, fe = a64.reshape(-1), e64.reshape(-1)
        if fa.numel() > 2:
            if bool(_close(fa[1:], fe[:-1], rtol, atol).all()):
                return "your result is the expected one moved one position later: an index is off by one"
            if bool(_close(fa[:-1], fe[1:], rtol, atol).all()):
                return "your result is the expected one moved one position earlier: an index is off by one"
    if not a.is_floating_point() and not e.is_floating_point():
        diff = (a.long() - e.long())
        if int(diff.abs().max()) == 1:
            k = int((diff != 0).sum())
            direction = " (always one too low: rounding down, not to the nearest)" if bool((diff <= 0).all()) else \
                " (always one too high)" if bool((diff >= 0).all()) else ""
            where = _where(bad, xt, blocksize, x_name)
            return (f"{k} of {diff.numel()} codes are one off{direction}: the rounding or the tie rule"
                    + (f"; {where}" if where else ""))
    where = _where(bad, xt, blocksize, x_name)
    if where:
        return where
    rel = float(((a64 - e64).abs() / e64.abs().clamp_min(1e-30)).max())
    for eps_dtype, name in ((2.0**-7, "bfloat16"), (2.0**-10, "float16"), (2.0**-22, "float32")):
        if rel <= eps_dtype * 1.01 and rel > rtol and bool((torch.sign(a64) == torch.sign(e64)).all()):
            return (f"your result is close but not exact: relative error up to {rel:.2g}, the rounding of {name} "
                    f"(or a lower precision somewhere): compute in the precision the exercise asks for (no "
                    f"{name} step in between)")
    if a64.is_floating_point() and bool((e64 != 0).all()) and bool((torch.sign(a64) == torch.sign(e64)).all()):
        ratio = a64 / e64
        return (f"your result has the right sign everywhere but the wrong size (ratio to the expected from "
                f"{float(ratio.min()):.3g} to {float(ratio.max()):.3g}, not one constant): a term that changes from "
                "entry to entry is computed otherwise than the rule says — work out the worst entry by hand")
    flips = (torch.sign(a64) != torch.sign(e64)) & (e64 != 0)
    if bool(flips.any()) and int(flips.sum()) < flips.numel() and bool((flips <= bad).all()) and \
            bool(_close(a64.abs(), e64.abs(), rtol, atol).all()):
        return f"your result has the right size but the wrong sign at {int(flips.sum())} of {flips.numel()} elements"
    lo, hi = float(a64.min()), float(a64.max())
    if bool(_close(a64, e64.clamp(lo, hi), rtol, atol).all()) and (float(e64.min()) < lo or float(e64.max()) > hi):
        return f"your result equals the expected one clipped to [{lo:.4g}, {hi:.4g}]: something clamps the values"
    return None


def _about(name: str, found: str) -> str:
    """``found`` (a sentence about "your result") said about ``name``."""
    return f"{name} {found[len('your result '):]}" if found.startswith("your result ") else f"{name}: {found}"


def describe_step(before: dict, got: dict, want: dict, *, rtol: float = 1e-5, atol: float = 1e-6,
                  blocksize: int | None = None, moments: tuple[str, ...] = (), g: Any = None) -> str | None:
    """For an optimizer step: WHICH outputs are wrong, and how the parameter's UPDATE differs.

    ``before``, ``got``, ``want``: ``{name: tensor}`` (the parameter under the key "p"). ``moments``
    names the states whose wrongness explains a wrong p (when they are wrong too, look there first); ``g``
    the gradient (to say "only where the gradient is NaN", "only where it is negative")."""
    wrong = [k for k in want if k in got and isinstance(got[k], torch.Tensor) and (
        got[k].shape != want[k].shape or not bool(_close(got[k].detach().cpu().double(),
                                                          want[k].detach().cpu().double(), rtol, atol).all()))]
    if not wrong:
        return None
    right = [k for k in want if k not in wrong]
    head = f"{', '.join(wrong)} {'is' if len(wrong) == 1 else 'are'} wrong" + (
        f" while {', '.join(right)} {'is' if len(right) == 1 else 'are'} right" if right else "")
    if wrong == ["p"] and "p" in before:
        p0 = before["p"].detach().cpu().double()
        d_got = got["p"].detach().cpu().double() - p0
        d_want = want["p"].detach().cpu().double() - p0
        if bool((d_got == 0).all()):
            return f"{head}: p did not move at all (update it in place: p.sub_(...), p.copy_(...))"
        scale = float(d_want.abs().max()) or 1.0
        found = describe(d_got, d_want, x=g, blocksize=blocksize, rtol=max(rtol, 1e-4), atol=max(atol, 1e-4 * scale),
                         x_name="gradient")
        return f"{head}; {_about('the update p_new - p', found)}" if found else (
            f"{head}: the moments are right, so the mistake is in the update of p (bias correction, sqrt, eps, lr, "
            "decay)")
    for k in sorted(wrong, key=lambda name: name not in moments):  # a wrong moment explains a wrong p
        if k == "p" and "p" in before:
            p0 = before["p"].detach().cpu().double()
            found = describe(got["p"].detach().cpu().double() - p0, want["p"].detach().cpu().double() - p0,
                             x=g, rtol=max(rtol, 1e-4), atol=atol, x_name="gradient")
            found = found and _about("the update p_new - p", found)
        else:
            found = describe(got[k], want[k], x=g if got[k].numel() == getattr(g, "numel", lambda: -1)() else None,
                             blocksize=blocksize, rtol=rtol, atol=atol, x_name="gradient")
            found = found and _about(k, found)
        if found:
            return f"{head}; {found}"
    first = next((k for k in wrong if k in moments), wrong[0])
    return f"{head}: look first at how your step computes {first}"


def case_pattern(outcomes: list[tuple[list[str], bool]]) -> str | None:
    """Across a check's inputs: the one kind of input on which (and only on which) the answer is wrong.

    ``outcomes``: per input, its tags ("with kind='adamw'", "whose size is not a multiple of blocksize")
    and whether the learner's answer was right on it. Returns a sentence naming the tag that every
    wrong input has and no right input has, or None (all right, all wrong, or no single tag)."""
    bad = [set(tags) for tags, ok in outcomes if not ok]
    good = [set(tags) for tags, ok in outcomes if ok]
    if not bad or not good or (len(good) == 1 and len(bad) > 2):  # right on one input only: no pattern to tell
        return None
    ordered = list(dict.fromkeys(tag for tags, _ in outcomes for tag in tags))
    for tag in ordered:
        if all(tag in tags for tags in bad) and not any(tag in tags for tags in good):
            return (f"your answer is right on {len(good)} of {len(outcomes)} inputs and wrong exactly on the "
                    f"{len(bad)} {tag}")
    return None
