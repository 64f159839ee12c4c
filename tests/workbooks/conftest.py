"""Workbook unit tests (minitorch style): the learner's functions, tested one exercise at a time.

    pytest tests/workbooks -m ex05                            # the solutions (default)
    pytest tests/workbooks --workbook-dir exercises -m ex05   # a learner's copy of workbook 05

``--workbook-dir`` (default: solutions/ of this repository) is the folder with the
``NN_topic.ipynb`` workbooks. The fixture ``workbook`` loads one of them by number —
``workbook("05").dynamic_map_from_scratch`` — executing only its solution cells
(:mod:`adam8lib.course.grading.workbook`). Tests are marked ``@pytest.mark.exNN`` (ex01…ex14).
"""

from pathlib import Path

import pytest

from adam8lib.course.grading.workbook import WorkbookLoader

REPO = Path(__file__).resolve().parents[2]
MARKERS = [f"ex{n:02d}" for n in range(1, 15)]


def pytest_addoption(parser):
    parser.addoption(
        "--workbook-dir",
        default=None,
        help="folder of NN_topic.ipynb workbooks whose solution cells the workbook tests load "
        "(default: solutions/)",
    )


def pytest_configure(config):
    for marker in MARKERS:
        config.addinivalue_line("markers", f"{marker}: unit tests of workbook {marker[2:]} (run them: -m {marker})")


@pytest.fixture(scope="session")
def workbook_dir(request) -> Path:
    # the option exists only when pytest starts in tests/workbooks (else this conftest loads late)
    folder = request.config.getoption("--workbook-dir", default=None)
    return Path(folder) if folder else REPO / "solutions"


@pytest.fixture(scope="session")
def workbook(workbook_dir) -> WorkbookLoader:
    """``workbook("05")`` → the names defined by workbook 05's solution cells."""
    return WorkbookLoader(workbook_dir)
