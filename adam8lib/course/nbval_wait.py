"""pytest plugin: how long ``pytest --nbval`` waits for a cell's output messages.

nbval sends a cell to the kernel, waits for the kernel's reply (``--nbval-cell-timeout``), and
then reads the cell's output messages one by one, waiting at most a fixed 5 seconds for each
(``IPyNbCell.output_timeout``; nbval 0.11 has no option for it). On a loaded machine the
kernel's output thread can fall more than 5 seconds behind a long training cell; nbval then
fails the cell with "Timeout of 5 seconds exceeded waiting for output", stops the kernel, and
every later cell of the notebook fails too. This plugin sets that wait for every collected
nbval cell from ``--adam8-output-wait SECONDS`` (default :data:`DEFAULT_OUTPUT_WAIT`).

A generous wait costs nothing when the messages come: nbval stops reading at the kernel's
"idle" status, which follows the last output. It only decides how long a silent kernel is
waited for before the cell fails.

Registered through the ``pytest11`` entry point ``adam8lib.course.nbval_wait`` (pyproject.toml),
so every ``pytest --nbval`` of an environment with adam8lib installed, instructors' included,
gets it; elsewhere pass ``-p adam8lib.course.nbval_wait``. Without nbval it does nothing.
"""

from __future__ import annotations

import pytest

__all__ = ["DEFAULT_OUTPUT_WAIT", "NBVAL_DEFAULT_WAIT"]

#: Seconds to wait for each output message of a cell (nbval's own value is NBVAL_DEFAULT_WAIT).
DEFAULT_OUTPUT_WAIT = 120.0
NBVAL_DEFAULT_WAIT = 5.0


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise pytest.UsageError(f"--adam8-output-wait must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise pytest.UsageError(f"--adam8-output-wait must be > 0 seconds, got {text!r}")
    return value


def pytest_addoption(parser):
    parser.getgroup("nbval").addoption(
        "--adam8-output-wait",
        metavar="SECONDS",
        default=str(DEFAULT_OUTPUT_WAIT),
        help=f"with --nbval: seconds to wait for each output message of a cell after the kernel replied "
        f"(default {DEFAULT_OUTPUT_WAIT:g}; nbval's own is a fixed {NBVAL_DEFAULT_WAIT:g})",
    )


def pytest_configure(config):
    config.adam8_output_wait = _positive_seconds(config.getoption("adam8_output_wait"))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    wait = getattr(config, "adam8_output_wait", DEFAULT_OUTPUT_WAIT)
    for item in items:
        if type(item).__name__ == "IPyNbCell" and hasattr(item, "output_timeout"):
            item.output_timeout = wait
