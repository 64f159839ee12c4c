"""Workbook 05 · the dynamic map: what learners write instead of the solution."""

from __future__ import annotations

import torch

from adam8lib.course import checks

from . import Right, Wrong


# ---------------------------------------------------------------------------- 05.1
def dynamic(*, midpoints=True, signed_points="2**i", ends=(0.0, 1.0), dtype=torch.float32, cast_back=False,
            offset=6, sort=True, as_list=False, extra_minus_one=False, geometric=False):
    def dynamic_map_from_scratch(signed=True):
        values = [torch.tensor(list(ends), dtype=dtype)] if ends else []
        if extra_minus_one and signed:
            values.append(torch.tensor([-1.0], dtype=dtype))
        for i in range(7):
            if signed:
                n = (2 ** (i + 1) if signed_points == "2**(i+1)" else 2**i) + 1
            else:
                n = (2 ** (i + 1) if signed_points != "unsigned_2**i" else 2**i) + 1
            grid = torch.linspace(0.1, 1.0, n, dtype=dtype)
            if geometric:  # a "midpoint on the log scale"
                dec = (grid[:-1] * grid[1:]).sqrt() * 10.0 ** (i - offset)
            else:
                dec = ((grid[:-1] + grid[1:]) / 2 if midpoints else grid) * 10.0 ** (i - offset)
            values.append(dec)
            if signed:
                values.append(-dec)
        out = torch.cat(values)
        out = torch.sort(out).values if sort else out
        out = out.float() if cast_back else out
        return out.tolist() if as_list else out

    return dynamic_map_from_scratch


def dynamic_with_loops(signed=True):
    entries = [0.0, 1.0]
    for i in range(7):
        n = 2**i if signed else 2 ** (i + 1)
        grid = torch.linspace(0.1, 1.0, n + 1)  # float32 by default
        for k in range(n):
            mid = ((grid[k] + grid[k + 1]) / 2 * 10.0 ** (i - 6)).item()
            entries += [mid, -mid] if signed else [mid]
    return torch.tensor(sorted(entries), dtype=torch.float32)


def dynamic_with_unfold(signed=True):
    parts = [torch.zeros(1), torch.ones(1)]
    for i in range(7):
        grid = torch.linspace(0.1, 1.0, (1 << (i if signed else i + 1)) + 1)
        mids = grid.unfold(0, 2, 1).sum(-1) / 2 * 10.0 ** (i - 6)
        parts += [mids, mids.neg()] if signed else [mids]
    return torch.cat(parts).sort().values


# ---------------------------------------------------------------------------- 05.2
def nearest(*, ties_up=False, only_searchsorted=False, clamp=True, dtype=torch.uint8, flatten=False,
            linear=False, normalise=False):
    def nearest_code(x, code):
        x = x.float()
        if normalise:
            x = x / x.abs().max()
        if linear:
            idx = torch.round((x - code[0]) / (code[-1] - code[0]) * 255).clamp(0, 255).long()
            return idx.to(dtype)
        flat = x.reshape(-1) if flatten else x
        hi = torch.searchsorted(code, flat)
        if only_searchsorted:
            return (hi.clamp(0, 255) if clamp else hi).to(dtype)
        if clamp:
            hi = hi.clamp(1, 255)
        lo = hi - 1
        d_hi, d_lo = code[hi] - flat, flat - code[lo]
        pick = d_hi <= d_lo if ties_up else d_hi < d_lo
        return torch.where(pick, hi, lo).to(dtype)

    return nearest_code


def nearest_by_loop(x, code):
    return torch.tensor([int((code - float(value)).abs().argmin()) for value in x], dtype=torch.uint8)


def nearest_by_argmin(x, code):
    return (x.float().unsqueeze(-1) - code).abs().argmin(dim=-1).to(torch.uint8)


def nearest_by_float64_distances(x, code):
    distances = (x.double().unsqueeze(-1) - code.double()).abs()
    return distances.argmin(dim=-1).to(torch.uint8)


def nearest_right_searchsorted(x, code):
    x = x.to(code.dtype)
    upper = torch.searchsorted(code, x, right=True).clamp(1, len(code) - 1)
    lower = upper - 1
    closer_up = (code[upper] - x).abs() < (x - code[lower]).abs()
    return torch.where(closer_up, upper, lower).byte()


# ---------------------------------------------------------------------------- 05.3
def decoder(*, midpoints=True, offset=6, mirror=True, unsigned_double=True, lead_off=0, fraction="k",
            zero_sign=0, one_decade=7, value_only=False, mirror_off=False):
    def decode_code(index, signed=True):
        if index == 255:
            fields = (1, one_decade, 0, 1.0)
            return fields[3] if value_only else fields
        if index == (127 if signed else 0):
            fields = (zero_sign, 0, 0, 0.0)
            return fields[3] if value_only else fields
        if signed:
            sign = 1 if index > 127 else -1
            j = index - 128 if sign > 0 else ((127 - index) if mirror_off else (126 - index) if mirror else index)
            tree = j + 1
            decade = tree.bit_length() - 1 + lead_off
            n = 2 ** (tree.bit_length() - 1)
        else:
            sign = 1
            tree = index - 1 + (2 if unsigned_double else 1)
            decade = tree.bit_length() - (2 if unsigned_double else 1) + lead_off
            n = 2 ** (tree.bit_length() - 1)
        k = tree - n
        frac = (2 * k + 1) / (2 * n) if midpoints else k / max(n - 1, 1)
        value = sign * 10.0 ** (decade - offset) * (0.1 + 0.9 * frac)
        if value_only:
            return value
        return sign, decade, (tree if fraction == "tree" else k), value

    return decode_code


def decode_with_strings(index, signed=True):
    if index == 255:
        return 1, 7, 0, 1.0
    if (signed and index == 127) or (not signed and index == 0):
        return 0, 0, 0, 0.0
    sign = (1 if index >= 128 else -1) if signed else 1
    bits = format((index - 128 if index >= 128 else 126 - index) + 1, "07b") if signed \
        else format(index + 1, "08b")
    lead = bits.index("1")
    after = bits[lead + 1:]
    decade = len(after) - (0 if signed else 1)
    fraction = int(after, 2) if after else 0
    n_values = 2 ** len(after)
    value = sign * 10 ** (decade - 6) * (0.1 + 0.9 * (fraction + 0.5) / n_values)
    return sign, decade, fraction, value


def decode_by_shifting(index, signed=True):
    zero = 127 if signed else 0
    if index in (zero, 255):
        return (0, 0, 0, 0.0) if index == zero else (1, 7, 0, 1.0)
    negative = signed and index < 127
    tree = (126 - index if negative else index - 128) + 1 if signed else index + 1
    position = 0
    while tree >> (position + 1):
        position += 1
    fraction = tree - (1 << position)
    decade = position if signed else position - 1
    n_values = 1 << position
    value = (0.1 + 0.9 * (2 * fraction + 1) / (2 * n_values)) / 10 ** (6 - decade)
    return (-1 if negative else 1), decade, fraction, (-value if negative else value)


_M, _N, _D = checks.check_dynamic_map, checks.check_nearest_code, checks.check_decode_code

WRONG = [
    # 05.1
    Wrong("05.1", _M, dynamic(midpoints=False), "grid points, not midpoints",
          "you kept the grid points", True),
    Wrong("05.1", _M, dynamic(signed_points="2**(i+1)"), "signed map with the unsigned point count",
          "you used 2**(i+1) + 1 points per decade for the signed map", True),
    Wrong("05.1", _M, dynamic(signed_points="unsigned_2**i"), "unsigned map with the signed point count",
          "you used 2**i + 1 points per decade for the unsigned map", True),
    Wrong("05.1", _M, dynamic(ends=()), "0.0 and 1.0 left out", "you left out 0.0 and 1.0", True),
    Wrong("05.1", _M, dynamic(ends=(0.0,)), "1.0 left out", "you left out 1.0", True),
    Wrong("05.1", _M, dynamic(extra_minus_one=True), "-1.0 added to the signed map", "you added -1.0", True),
    Wrong("05.1", _M, dynamic(dtype=torch.float64), "built in float64", "you returned torch.float64", True),
    Wrong("05.1", _M, dynamic(dtype=torch.float64, cast_back=True), "float64 then cast to float32",
          "you computed in float64 and cast to float32", True),
    Wrong("05.1", _M, dynamic(offset=7), "decades scaled by 10**(i - 7)", "your decades are 10x too small", True),
    Wrong("05.1", _M, dynamic(offset=5), "decades scaled by 10**(i - 5)", "your decades are 10x too large", True),
    Wrong("05.1", _M, dynamic(sort=False), "not sorted", "you did not sort", True),
    Wrong("05.1", _M, dynamic(as_list=True), "a Python list", "you returned a list", True),
    # not recognised: the check can only restate the rule
    Wrong("05.1", _M, dynamic(geometric=True), "geometric midpoints sqrt(a * b)",
          "decade i: midpoints of linspace(0.1, 1, n_i)", False),
    # 05.2
    Wrong("05.2", _N, nearest(ties_up=True), "ties to the upper index", "you broke ties towards the UPPER", True),
    Wrong("05.2", _N, nearest(only_searchsorted=True), "searchsorted alone",
          "you returned searchsorted's index", True),
    Wrong("05.2", _N, nearest(clamp=False), "searchsorted's index not clamped (code[-1] is the last entry)",
          "you did not clamp searchsorted's index", True),
    Wrong("05.2", _N, nearest(dtype=torch.int64), "int64 indices", "you returned torch.int64 indices", True),
    Wrong("05.2", _N, nearest(dtype=torch.int8), "int8 codes", "int8 holds only -128..127", True),
    Wrong("05.2", _N, nearest(flatten=True), "flattened result", "you returned a flat", True),
    Wrong("05.2", _N, nearest(linear=True), "index from a linear formula",
          "you computed the index with a linear formula", True),
    Wrong("05.2", _N, nearest_by_loop, "a Python loop over the values (1-D only)",
          "your function failed on a tensor of shape (3, 7)", True),
    Wrong("05.2", _N, nearest(normalise=True), "x divided by its absmax again", "you divided x by its absmax", True),
    # 05.3
    Wrong("05.3", _D, decoder(midpoints=False), "grid point instead of midpoint",
          "you took the grid point", True),
    Wrong("05.3", _D, decoder(offset=7), "10**(i - 7)", "your values are 10x too small", True),
    Wrong("05.3", _D, decoder(offset=5), "10**(i - 5)", "your values are 10x too large", True),
    Wrong("05.3", _D, decoder(mirror=False), "negative j = index (no mirror)",
          "you read negative entries like positive ones", True),
    Wrong("05.3", _D, decoder(mirror_off=True), "negative j = 127 - index", "you used j = 127 - index", True),
    Wrong("05.3", _D, decoder(unsigned_double=False), "unsigned read like the signed map",
          "you read the unsigned map like the signed one", True),
    Wrong("05.3", _D, decoder(lead_off=1), "decade = bit_length()", "you took decade = bit_length()", True),
    Wrong("05.3", _D, decoder(fraction="tree"), "fraction = the whole tree code",
          "you returned the whole tree code as the fraction", True),
    Wrong("05.3", _D, decoder(zero_sign=1), "the zero entry with sign +1", "the zero entry has sign 0", True),
    Wrong("05.3", _D, decoder(one_decade=6), "1.0 reported in decade 6", "the entry 1.0 is (1, 7, 0, 1.0)", True),
    Wrong("05.3", _D, decoder(value_only=True), "only the value returned", "you returned only", True),
]

RIGHT = [
    Right("05.1", _M, dynamic_with_loops, how="Python loops over grid pairs, .item(), sorted() and torch.tensor"),
    Right("05.1", _M, dynamic_with_unfold, how="unfold(0, 2, 1) pairs, 1 << i, Tensor.sort"),
    Right("05.2", _N, nearest_by_argmin, how="broadcast |x - code| and argmin (first minimum on ties)"),
    Right("05.2", _N, nearest_by_float64_distances, how="argmin of |x - code| measured in float64"),
    Right("05.2", _N, nearest_right_searchsorted, how="searchsorted(right=True), abs distances, .byte()"),
    Right("05.3", _D, decode_by_shifting, how="leading 1 found by shifting, value divided by 10**(6 - decade)"),
    Right("05.3", _D, decode_with_strings, how="bit strings with format(…, 'b') and str.index"),
]
