"""The workbook checks: one ``check_<exercise>`` function per exercise.

A workbook's check cell calls exactly one of them::

    from adam8lib.course.checks import check_dynamic_map
    check_dynamic_map(dynamic_map_from_scratch)

Each lives in ``adam8lib/course/checks/exNN_<topic>.py`` (one module per workbook). This package
imports every ``ex*`` module automatically and re-exports the ``check_*`` functions that the
module defines, so adding a workbook's checks needs no edit here. Two modules defining the
same check name is an error (the name is the exercise id in grade reports).

* :data:`CHECKS` — ``{exercise id: check function}`` (id = function name without ``check_``)
* :data:`CHECK_MODULES` — ``{check function name: module name}``
* :mod:`adam8lib.course.checks._common` — helpers for writing checks (``call``, ``assert_close``,
  ``assert_equal``, ``fail``, ``passed``); see its docstring.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

from ._common import success_line

CHECKS: dict[str, Callable] = {}
CHECK_MODULES: dict[str, str] = {}


def _collect() -> list[str]:
    names: list[str] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if not info.name.startswith("ex"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for attr, obj in vars(module).items():
            if not attr.startswith("check_") or not callable(obj):
                continue
            if getattr(obj, "__module__", None) != module.__name__:
                continue  # imported from elsewhere, exported by its own module
            if attr in CHECK_MODULES:
                raise ImportError(
                    f"{attr} is defined in both {CHECK_MODULES[attr]} and {module.__name__}: "
                    "check names are exercise ids and must be unique"
                )
            CHECK_MODULES[attr] = module.__name__
            CHECKS[attr[len("check_"):]] = obj
            globals()[attr] = obj
            names.append(attr)
    return names


__all__ = ["CHECKS", "CHECK_MODULES", "success_line", *_collect()]
