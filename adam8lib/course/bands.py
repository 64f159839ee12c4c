"""Checks that print what holds on any machine: a measured figure against the band a lesson claims.

A lesson measures things whose last digits depend on the machine: a loss after training, an
error rate, a drift, a ratio. Those figures are printed in a cell whose output is not compared
(tagged ``nbval-ignore-output``), and the cell after it states the claim the lesson makes about
them with :func:`check_band` or :func:`check_claim`. Their output is the claim, not the figure::

    check_band("median relative error of v, dynamic map", err, high=0.1, unit="")
    ✔ median relative error of v, dynamic map: below 0.1

So the stored output is the same on every machine where the claim holds, and a machine where it
does not fails with an AssertionError that names the measured value. The bands are written in
the cell's source: ``tests/course/test_portable_outputs.py`` checks that every decimal number a
compared output prints is either written in its cell's source or declared exact (see
``PORTABLE_KEY`` there).
"""

from __future__ import annotations

import math
import re

__all__ = ["check_band", "check_claim"]


def _number(x: float) -> str:
    """A band limit as a lesson writes it: ``30``, ``0.05``, ``1e-6`` (``repr`` without the
    exponent's padding zeros; integral values without ``.0``)."""
    x = float(x)
    if x.is_integer() and abs(x) < 1e16:
        return str(int(x))
    return re.sub(r"e([+-])0*(\d)", lambda m: "e" + ("-" if m.group(1) == "-" else "") + m.group(2), repr(x))


def check_band(what: str, value: float, *, low: float | None = None, high: float | None = None,
               unit: str = "") -> None:
    """Assert ``low <= value <= high`` (either side may be open) and print the claim with a ✔.

    ``value`` is the measured figure (a float or a 0-d tensor); ``unit`` is appended to the
    limits (e.g. ``" %"``). Raises ``AssertionError`` with the measured value when it is outside
    the band or not finite, ``ValueError`` for a band without limits or with ``low > high``.
    """
    if low is None and high is None:
        raise ValueError("check_band needs low, high or both")
    if low is not None and high is not None and low > high:
        raise ValueError(f"check_band: low {low!r} is above high {high!r}")
    value = float(value)
    if low is not None and high is not None:
        band = f"between {_number(low)} and {_number(high)}{unit}"
    elif high is not None:
        band = f"at most {_number(high)}{unit}"
    else:
        band = f"at least {_number(low)}{unit}"
    inside = math.isfinite(value) and (low is None or value >= low) and (high is None or value <= high)
    if not inside:
        raise AssertionError(f"{what}: measured {value!r}{unit}, expected {band}")
    print(f"✔ {what}: {band}")


def check_claim(claim: str, holds: bool, measured: str = "") -> None:
    """Assert a yes/no claim (``holds``) and print it with a ✔; ``measured`` goes in the error."""
    if not isinstance(holds, bool):
        holds = bool(holds)
    if not holds:
        raise AssertionError(f"not true here: {claim}" + (f" ({measured})" if measured else ""))
    print(f"✔ {claim}")
