"""Workbooks and grading: solutions/ → exercises/, nbval scoring, class gradebooks.

* :mod:`adam8lib.course.grading.conventions` — the workbook conventions in code: solution spans,
  check cells, points, source hashes, the manifest.
* :mod:`adam8lib.course.grading.generate` — ``python -m adam8lib.course.grading.generate solutions exercises``
  (``make exercises``; ``--check`` fails when exercises/ is out of sync).
* :mod:`adam8lib.course.grading.plugin` — the pytest plugin (registered through the ``pytest11``
  entry point ``adam8lib.course.grading.plugin``): score summary after ``pytest --nbval``,
  ``--grade-report FILE.json|FILE.csv``, check-cell integrity against the manifest.
* :mod:`adam8lib.course.grading.gradebook` — ``make grade SUBMISSIONS=dir`` → grades/gradebook.csv.
* :mod:`adam8lib.course.grading.workbook` — load the functions a workbook's solution cells define
  (used by the workbook unit tests in tests/workbooks).
"""
