"""Workbooks and grading: solutions/ → exercises/, nbval scoring, class gradebooks.

* :mod:`adam8lib.course.grading.conventions` — the workbook conventions in code: solution spans,
  check cells, points, source hashes, the manifest.
* :mod:`adam8lib.course.grading.generate` — ``python -m adam8lib.course.grading.generate solutions exercises``
  (``make exercises``; ``--check`` fails when exercises/ is out of sync).
* :mod:`adam8lib.course.grading.plugin` — the pytest plugin (registered through the ``pytest11``
  entry point ``adam8lib.course.grading.plugin``): score summary after ``pytest --nbval``,
  ``--grade-report FILE.json|FILE.csv``, check-cell integrity against the manifest.
* :mod:`adam8lib.course.grading.gradebook` — ``make grade SUBMISSIONS=dir`` → grades/gradebook.csv:
  each learner workbook graded by :mod:`~adam8lib.course.grading.runner` (a process the notebook
  never ran in) inside :mod:`~adam8lib.course.grading.sandbox` (bubblewrap when available).
* :mod:`adam8lib.course.grading.feedback` — after grading, ``grades/learners/<learner>.html`` (score per
  exercise, hints, the lesson section to read again) and ``grades/class.html`` (pass rates, the most
  frequent hints), from the Jinja2 templates in ``templates/``; sections per exercise in
  :mod:`~adam8lib.course.grading.lessons`.
* :mod:`adam8lib.course.grading.channel` — the gradebook's side of a grading child (pipes, deadlines, kill).
* :mod:`adam8lib.course.grading.selfcheck` — a learner's ``pytest --nbval`` self-check without the
  folder's conftest.py / pytest.ini / manifest.
* :mod:`adam8lib.course.grading.workbook` — load the functions a workbook's solution cells define
  (used by the workbook unit tests in tests/workbooks).
"""
