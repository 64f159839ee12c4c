# adam8 — the two quickstart commands are `make lab` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_PIN := torch==2.13.0
# Where torch comes from. Empty = pip's default (a local wheel here; PyPI elsewhere).
# On a CPU-only Linux box elsewhere: make lab TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
EXTRAS ?= course,test,gpu
PYTEST := $(PY) -m pytest

.PHONY: lab test unit setup exercises outputs grade bench clean help

help:
	@echo "make lab        - set up .venv (first time) and start JupyterLab on the course"
	@echo "make test       - set up .venv (first time) and run the whole test suite (what CI runs)"
	@echo "make unit       - only the unit tests (pytest tests), no notebooks"
	@echo "make setup      - create .venv and install torch $(TORCH_PIN) + the course (extras: $(EXTRAS))"
	@echo "make outputs    - re-execute lessons and solutions on the CPU and store their outputs"
	@echo "make exercises  - regenerate exercises/ (the learners' workbooks) from solutions/"
	@echo "make grade      - grade a class: SUBMISSIONS=folder -> grades/gradebook.csv"
	@echo "make bench      - side-by-side CPU benchmark of the 8-bit step (writes bench/README.md)"
	@echo "make clean      - remove .venv and test caches"

$(VENV)/.installed: pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) $(TORCH_PIN)
	$(PY) -m pip install -q -c constraints.txt -e ".[$(EXTRAS)]"
	@touch $@

setup: $(VENV)/.installed

lab: setup
	$(VENV)/bin/jupyter lab notebooks/

# The whole suite: unit tests, then notebooks through nbval (as they exist).
test: setup
	$(PYTEST) tests
	@nb=$$(ls notebooks/*.ipynb solutions/*.ipynb 2>/dev/null); \
	if [ -n "$$nb" ]; then $(PYTEST) --nbval --nbval-current-env -p no:randomly $$nb; fi

unit: setup
	$(PYTEST) tests

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

# ---- course tooling (each target's module is documented in README) ----
# Re-execute lessons and solutions on the CPU and store their outputs (deterministic).
outputs: setup
	$(PY) -m adam8lib.course.outputs execute notebooks solutions

# Regenerate the learner workbooks from the solutions.
exercises: setup
	$(PY) -m adam8lib.course.grading.generate solutions exercises

# Grade a class: one subfolder of notebooks per learner -> grades/gradebook.csv
SUBMISSIONS ?= submissions
grade: setup
	$(PY) -m adam8lib.course.grading.gradebook $(SUBMISSIONS) --out grades/gradebook.csv

# Side-by-side CPU benchmark of the 8-bit step (writes bench/README.md tables).
bench: setup
	$(PY) -m pip install -q -c constraints.txt -e ".[bench]"
	$(PY) bench/bench_step.py

