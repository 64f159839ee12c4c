"""What only the course needs — the library (:mod:`adam8lib`) never imports this package.

* :mod:`~adam8lib.course.environment` — ``setup()``, cell 0 of every notebook (Colab, seeds, quiet logs)
* :mod:`~adam8lib.course.links` — cells 0/1 and README badges from the repository URL (pyproject)
* :mod:`~adam8lib.course.outputs` — runs notebooks on the CPU and stores their outputs (``make outputs``)
* :mod:`~adam8lib.course.finetune` — DistilBERT, data loaders, metrics, ``Trainer``/``accelerate`` helpers
* :mod:`~adam8lib.course.data` — the offline paraphrase data and tokenizer (GLUE MRPC when the hub answers)
* :mod:`~adam8lib.course.plots` — plotting helpers of the lessons
* :mod:`~adam8lib.course.checks` — the check cells' functions (``check_*``), one module per workbook
* :mod:`~adam8lib.course.grading` — workbook generator, ``pytest --nbval`` plugin, gradebook
* :mod:`~adam8lib.course.hints` — ``hint("NN.k")``: hints on request, in three steps, for every graded exercise
"""

from .environment import COLAB_BADGE, REPO_URL, SETUP_CELL, Environment, colab_url, in_colab, setup

__all__ = ["setup", "Environment", "in_colab", "colab_url", "REPO_URL", "SETUP_CELL", "COLAB_BADGE", "hint"]


def hint(exercise) -> None:
    """The next hint for a graded exercise, one level per call: ``hint("13.1")`` (see :mod:`.hints`; imported on
    first use, so that cell 0's ``setup`` does not load the checks)."""
    from .hints import hint as _hint

    _hint(exercise)
