"""The second-machine configuration bites, and nbval's output wait is ours to set.

``make test-second-machine`` re-runs the notebooks under adam8lib.course.second_machine's
configuration. These tests show that it changes what floating-point code computes (so outputs
that depend on it fail there), that a planted over-precise print passes here and fails there while
its portable twin passes in both, and that the nbval plugin sets the output wait.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell, new_notebook

from adam8lib.course import outputs
from adam8lib.course.nbval_wait import DEFAULT_OUTPUT_WAIT, _positive_seconds
from adam8lib.course.second_machine import SECOND_MACHINE_ENV, second_machine_env

ROOT = Path(__file__).resolve().parents[2]
NATIVE = outputs.execution_env()  # the configuration that stores outputs (make outputs)
SECOND = second_machine_env(NATIVE)

needs_a_vector_path = pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() == "DEFAULT",
    reason="this CPU has no vector path beyond torch's generic kernels (no AVX2): the two configurations coincide",
)

#: What a lesson computes, printed raw: a linspace grid, a seeded matrix product, a short training run.
RAW = """
import json, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
x, y = torch.randn(256, 32), torch.randint(0, 4, (256,))
for _ in range(30):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
a, b = torch.randn(300, 300), torch.randn(300, 300)
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
                  "linspace": torch.linspace(0.1, 1.0, 129).tolist(), "matmul": (a @ b).sum().item(),
                  "softmax": torch.softmax(a, dim=1).sum().item(), "loss after 30 Adam steps": loss.item()}))
"""


def raw_numbers(env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", RAW], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_a_vector_path
def test_second_machine_changes_the_raw_numbers_lessons_compute():
    here, there = raw_numbers(NATIVE), raw_numbers(SECOND)
    assert (here["capability"], there["capability"]) != ("DEFAULT", "DEFAULT") and there["capability"] == "DEFAULT"
    assert (here["threads"], there["threads"]) == (2, 1)
    # torch.linspace rounds its grid differently (fused multiply-add or not); a short training run's loss
    # moves in its last digits: either would fail a compared output that prints it in full
    assert here["linspace"] != there["linspace"]
    assert here["loss after 30 Adam steps"] != there["loss after 30 Adam steps"]
    # ... by little: what a lesson claims about it (a band) holds in both
    assert abs(here["loss after 30 Adam steps"] - there["loss after 30 Adam steps"]) < 1e-3


PLANTED = [
    new_code_cell("import torch\nfrom adam8lib.course.bands import check_band\ntorch.manual_seed(0)\n"
                  "model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))\n"
                  "opt = torch.optim.Adam(model.parameters(), lr=1e-2)\n"
                  "x, y = torch.randn(256, 32), torch.randint(0, 4, (256,))\n"
                  "for _ in range(30):\n"
                  "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
                  "    opt.zero_grad(); loss.backward(); opt.step()"),
    new_code_cell('print(f"loss after 30 steps: {loss.item():.9f}")  # over-precise: depends on the machine'),
    new_code_cell('check_band("loss after 30 steps", loss.item(), low=0.1, high=1.3)  # the portable twin'),
]


def nbval(path: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env", "-p", "no:randomly",
                           "-p", "no:cacheprovider", "-rA", str(path)], env=env, cwd=path.parent, capture_output=True,
                          text=True, timeout=600)


@needs_a_vector_path
def test_a_planted_over_precise_print_fails_on_the_second_machine_and_its_band_passes(tmp_path):
    path = tmp_path / "planted.ipynb"
    nbformat.write(new_notebook(cells=PLANTED), path)
    outputs.execute_notebook(path)  # stored outputs from this machine, as make outputs stores them
    stored = nbformat.read(path, as_version=4).cells[1].outputs[0].text
    assert stored.startswith("loss after 30 steps: 0.") and len(stored.strip()) > 30

    here = nbval(path, NATIVE)
    assert here.returncode == 0, here.stdout[-3000:]
    there = nbval(path, SECOND)
    assert there.returncode == 1, there.stdout[-3000:]
    assert "FAILED planted.ipynb::Cell 1" in there.stdout and "PASSED planted.ipynb::Cell 2" in there.stdout
    assert "FAILED planted.ipynb::Cell 2" not in there.stdout


def test_second_machine_command_runs_a_command_in_that_configuration():
    out = subprocess.run([sys.executable, "-m", "adam8lib.course.second_machine", sys.executable, "-c",
                          "import os, json; print(json.dumps({k: os.environ.get(k) for k in %r}))" % list(SECOND_MACHINE_ENV)],
                         capture_output=True, text=True, timeout=60, env=dict(os.environ, OMP_NUM_THREADS="7"))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == SECOND_MACHINE_ENV  # overrides the caller's
    listed = subprocess.run([sys.executable, "-m", "adam8lib.course.second_machine", "--print"], capture_output=True,
                            text=True, timeout=60)
    assert listed.stdout.split() == [f"{k}={v}" for k, v in SECOND_MACHINE_ENV.items()]


def test_ci_runs_the_second_machine_after_make_test():
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.index("make test\n") < ci.index("make test-second-machine")
    makefile = (ROOT / "Makefile").read_text()
    target = makefile.split("\ntest-second-machine:", 1)[1].split("\n\n", 1)[0]
    assert "adam8lib.course.second_machine" in makefile and "$(NOTEBOOKS)" in target and "grade-solutions" in target


# ------------------------------------------------------------------ nbval's output wait
CONFTEST = textwrap.dedent("""
    def pytest_collection_finish(session):
        print("WAITS", sorted({getattr(item, "output_timeout", None) for item in session.items}))
""")


def collect(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    nbformat.write(new_notebook(cells=[new_code_cell("1 + 1")]), tmp_path / "nb.ipynb")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    return subprocess.run([sys.executable, "-m", "pytest", "--nbval", "--collect-only", "-q", "-s", "-p",
                           "no:cacheprovider", "nb.ipynb", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)


def test_nbval_output_wait_is_set_by_the_plugin(tmp_path):
    default = collect(tmp_path)
    assert f"WAITS [{DEFAULT_OUTPUT_WAIT}]" in default.stdout, default.stdout + default.stderr
    chosen = collect(tmp_path, "--adam8-output-wait", "7.5")
    assert "WAITS [7.5]" in chosen.stdout, chosen.stdout + chosen.stderr
    refused = collect(tmp_path, "--adam8-output-wait", "soon")
    assert refused.returncode != 0 and "--adam8-output-wait must be a number of seconds" in refused.stderr


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "soon"])
def test_nbval_output_wait_must_be_positive_seconds(bad):
    with pytest.raises(pytest.UsageError, match="--adam8-output-wait must be"):
        _positive_seconds(bad)


#: A compiled forward next to the eager one (what tests/test_torch_optim_conventions.py compiles).
COMPILED = """
import json, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
x = torch.randn(16, 16)
with torch.no_grad():
    print(json.dumps({"max |compiled - eager|": (torch.compile(model)(x) - model(x)).abs().max().item()}))
"""


@needs_a_vector_path
@pytest.mark.slow
def test_torch_compile_after_a_native_compile_stays_right_on_the_second_machine(tmp_path):
    """Inductor's kernel cache is keyed without ATEN_CPU_CAPABILITY: a kernel cached by a native run (AVX-512's 16
    lanes) and rebuilt against the second machine's vector headers computed logits off by 0.3 (or failed to build).
    The second machine keeps its own cache (TORCHINDUCTOR_CACHE_DIR), so a native compile first cannot poison it."""
    native = {**NATIVE, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}  # the cache a native run fills
    second = second_machine_env(native)
    assert second["TORCHINDUCTOR_CACHE_DIR"] != native["TORCHINDUCTOR_CACHE_DIR"]
    for env in (native, second):
        out = subprocess.run([sys.executable, "-c", COMPILED], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout.strip().splitlines()[-1])["max |compiled - eager|"] <= 1e-5
