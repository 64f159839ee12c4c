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

.PHONY: lab test unit setup exercises outputs grade grade-solutions sandbox bench clean help browser-test wrong-answers \
        test-second-machine test-gpu

help:
	@echo "make lab        - set up .venv (first time) and start JupyterLab on the course"
	@echo "                  (PORT=8888, LAB_ARGS='--ip=0.0.0.0' ... to override; root and headless work)"
	@echo "make test       - set up .venv (first time) and run the whole test suite (what CI runs)"
	@echo "make browser-test - run every lesson in JupyterLab in a real Chromium (Playwright)"
	@echo "make unit       - only the unit tests (pytest tests), no notebooks"
	@echo "make test-second-machine - the notebooks again under another numeric configuration, and the"
	@echo "                  solutions graded there (what CI runs after make test)"
	@echo "make wrong-answers - the plausible wrong answers to every exercise through their checks (counts)"
	@echo "make grade-solutions - grade the course's own solutions as a class of one: full marks or exit 3"
	@echo "make test-gpu   - the notebooks under nbval on a CUDA GPU, then the GPU kernel tests"
	@echo "make setup      - create .venv and install $(TORCH_PIN) + the course (extras: $(EXTRAS))"
	@echo "make outputs    - re-execute lessons and solutions on the CPU and store their outputs"
	@echo "make exercises  - regenerate exercises/ (the learners' workbooks) from solutions/"
	@echo "make grade      - grade a class: SUBMISSIONS=folder -> grades/gradebook.csv (in bubblewrap; SANDBOX=none without)"
	@echo "make bench      - side-by-side CPU benchmarks: the 8-bit step, 4-bit/FP8 next to torchao, the 8-bit family next to bitsandbytes (bench/README.md)"
	@echo "make clean      - remove .venv and test caches"

# ---- starting a server the same way for everyone ----
# root (containers, cloud boxes): Jupyter refuses to start without --allow-root, so pass it only
# when we ARE root. No display (headless server, CI, ssh): don't try to open a browser; the
# server prints its URL with the token to click or paste. macOS opens browsers without $DISPLAY.
PORT ?= 8888
LAB_ARGS ?=
USER_ID ?= $(shell id -u)
UNAME := $(shell uname -s)
ROOT_FLAG = $(if $(filter 0,$(USER_ID)),--allow-root)
BROWSER_FLAG = $(if $(or $(DISPLAY),$(WAYLAND_DISPLAY),$(filter Darwin,$(UNAME))),,--no-browser)
SERVER_FLAGS = --ServerApp.port=$(PORT) $(ROOT_FLAG) $(BROWSER_FLAG)

$(VENV)/.installed: pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) $(TORCH_PIN)
	$(PY) -m pip install -q -c constraints.txt -e ".[$(EXTRAS)]"
	@touch $@

setup: $(VENV)/.installed

lab: setup
	@echo "Starting JupyterLab on port $(PORT) (open the http://127.0.0.1:...?token=... URL it prints; Ctrl-C stops it)"
	$(PY) -m jupyterlab $(SERVER_FLAGS) --ServerApp.root_dir=$(CURDIR) --LabApp.default_url=/lab/tree/notebooks $(LAB_ARGS)

# ---- tests ----
# pytest-xdist: one worker per core (JOBS=1: a single process). --dist loadfile sends a whole file
# to one worker, so every cell of a notebook runs in one kernel, in order. With several workers each
# uses one thread (workers x threads = cores; compared outputs do not depend on the thread count).
JOBS ?= auto
XDIST = $(if $(filter 1,$(JOBS)),,-n $(JOBS) --dist loadfile)
ONE_THREAD = $(if $(filter 1,$(JOBS)),,OMP_NUM_THREADS=1 MKL_NUM_THREADS=1)
NOTEBOOKS = notebooks/*.ipynb solutions/*.ipynb
NBVAL = --nbval --nbval-current-env -p no:randomly
DURATIONS ?= 25

# The whole suite in one pytest run: unit and course tests, then every lesson and solution
# through nbval (stored outputs re-computed and compared; the solutions' checks scored).
test: setup
	$(ONE_THREAD) $(PYTEST) $(XDIST) --durations=$(DURATIONS) tests --ignore=tests/fixtures $(NBVAL) $(NOTEBOOKS)

unit: setup
	$(ONE_THREAD) $(PYTEST) $(XDIST) tests

# The notebooks (and the unit tests that compare bits: the C++ kernels', the stored checkpoints' continuations) as another machine runs them (adam8lib/course/second_machine.py: torch's generic CPU
# kernels, MKL/oneDNN at AVX2, one thread, adam8lib's kernel without AVX-512), then the solutions
# graded as a class under it: compared outputs must hold and correct work must score full marks.
SECOND = $(PY) -m adam8lib.course.second_machine
# unit tests that compare bits with stored numbers (keyed by the numeric path: tests/_continuations.py), run again
# under MKL's one path for every x86 CPU (MKL_CBWR=COMPATIBLE: what an Intel Xeon's vector sqrt is not natively)
BIT_TESTS = tests/test_checkpoint_fixture.py tests/test_quantized_state.py tests/test_rank1_chunks.py
test-second-machine: setup
	$(SECOND) $(PYTEST) $(XDIST) $(NBVAL) $(NOTEBOOKS) tests/kernels/test_cpu.py tests/kernels/test_cpu_formats.py tests/kernels/test_cpu_rules.py \
	    $(BIT_TESTS)
	MKL_CBWR=COMPATIBLE $(ONE_THREAD) $(PYTEST) $(XDIST) $(BIT_TESTS)
	$(SECOND) $(MAKE) --no-print-directory grade-solutions

# The course's own solutions as one learner's submission, graded like a class: every point or exit 3.
# Every plausible wrong answer of tests/workbooks/wrong_answers through its check: per exercise how many
# are caught with their hint, how many hints name the mistake, how many right variants pass.
wrong-answers: setup
	$(PY) -m tests.workbooks.wrong_answers

grade-solutions: setup sandbox
	@tmp=$$(mktemp -d); mkdir -p "$$tmp/submissions/solutions"; cp solutions/*.ipynb "$$tmp/submissions/solutions/"; \
	$(PY) -m adam8lib.course.grading.gradebook "$$tmp/submissions" --out "$$tmp/grades/gradebook.csv" \
	    --jobs 1 --require-full-marks --sandbox $(SANDBOX); rc=$$?; rm -rf "$$tmp"; exit $$rc

# The gradebook's sandbox: bubblewrap, installed with apt-get where we are root (as .ci/run does);
# elsewhere it says what to install. The gradebook itself refuses to grade without it unless
# SANDBOX=none (make grade SANDBOX=none ...: learners' code then runs with your permissions).
SANDBOX ?= bwrap
sandbox:
	@if [ "$(SANDBOX)" != none ] && ! command -v bwrap >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing bubblewrap, the gradebook's sandbox (apt-get)"; \
	    apt-get install -y -q bubblewrap >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null; }; \
	  else \
	    echo "the gradebook needs bubblewrap: 'sudo apt-get install bubblewrap' (Debian/Ubuntu), or grade" \
	         "without a sandbox with SANDBOX=none (learners' code then runs with your permissions)" >&2; exit 1; \
	  fi; \
	fi

# On a machine with a CUDA GPU (Colab, a cloud box): every lesson and solution under nbval on the
# GPU, then the GPU kernel tests (bench/gpu_check.sh has the GPU benchmarks).
test-gpu: setup
	$(PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'make test-gpu needs a CUDA GPU')"
	$(PYTEST) $(NBVAL) --durations=$(DURATIONS) $(NOTEBOOKS)
	$(PYTEST) tests/kernels -m gpu -q

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

# JupyterLab in a real Chromium (Playwright for Python + the system's Chromium; Playwright's own
# browser download is not used): every lesson through Run All Cells, one workbook typed by keyboard.
# Screenshots land in browser-artifacts/. Installs Chromium with apt only when it is missing and we
# are root; otherwise says what to install.
browser-test: setup
	@$(PY) -c "import playwright" 2>/dev/null || $(PY) -m pip install -q -c constraints.txt -e ".[browser]"
	@if [ -z "$$CHROMIUM" ] && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's chromium (apt-get)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "make browser-test needs a system Chromium: 'sudo apt-get install chromium' (Debian/Ubuntu)," \
	         "or CHROMIUM=/path/to/chrome make browser-test" >&2; exit 1; \
	  fi; \
	fi
	ADAM8_BROWSER=1 $(PYTEST) tests/browser -p no:randomly -v --durations=0

# ---- course tooling (each target's module is documented in README) ----
# Re-execute lessons and solutions on the CPU and store their outputs (deterministic).
outputs: setup
	$(PY) -m adam8lib.course.outputs execute notebooks solutions

# Regenerate the learner workbooks from the solutions.
exercises: setup
	$(PY) -m adam8lib.course.grading.generate solutions exercises

# Grade a class: one subfolder of notebooks per learner -> grades/gradebook.csv
SUBMISSIONS ?= submissions
grade: setup sandbox
	$(PY) -m adam8lib.course.grading.gradebook $(SUBMISSIONS) --out grades/gradebook.csv --sandbox $(SANDBOX)

# Side-by-side CPU benchmark of the 8-bit step (writes bench/README.md tables).
bench: setup
	$(PY) -m pip install -q -c constraints.txt -e ".[bench]"
	$(PY) bench/bench_step.py
	$(PY) bench/bench_formats.py
	$(PY) bench/bench_family.py

