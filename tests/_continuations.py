"""Where a stored continuation digest may be compared: the numeric path of the primitives it went through.

tests/fixtures/checkpoints/main_checkpoints.pt stores, for each optimizer, a SHA-256 of its parameters and
states 4 steps after a checkpoint. Those bits go through ``torch.sqrt`` (MKL's vector math on x86, whose code
path differs between CPUs: MKL's AVX-512 path on an Intel Xeon rounds other elements than its generic path,
which AMD CPUs get), through ``add_(alpha=)``/``addcmul_`` (fused multiply-adds where ATen's vector kernels
run, not with its generic ones) and through division. A digest is valid only where those primitives give the
same bits as where it was recorded. So a recorded continuation is *keyed*: :func:`numeric_key` hashes what
exactly those primitives return on fixed probes, and tests/fixtures/checkpoints/continuations.json holds
the digests per key.

:func:`continuation_digests` gives the library's continuations on this machine when its key has recorded
digests; otherwise it recomputes them in a child process under ``MKL_CBWR=COMPATIBLE`` (MKL's conditional
numerical reproducibility mode: one code path on every x86 CPU, the path the recorded key was measured on),
where the key is checked again. Only where neither key has recorded digests (another architecture, another
MKL) is there nothing to compare against, and the caller skips, naming both keys.

    python -m tests._continuations          # this process's key and the library's digests, as JSON
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "checkpoints"
RECORDED = FIXTURES / "continuations.json"
#: the environment under which a machine whose own key is unknown recomputes the continuations
PORTABLE_ENV = {"MKL_CBWR": "COMPATIBLE"}

sys.path.insert(0, str(FIXTURES))
import build_main_checkpoints as builder  # noqa: E402


def _probe(seed: int, n: int = 1 << 14) -> torch.Tensor:
    """Positive floats over 60 binades (exact, from integers), and an odd length for the vector tails."""
    gen = torch.Generator().manual_seed(seed)
    mantissa = torch.randint(1 << 23, 1 << 24, (n + 3,), generator=gen).double()
    exponent = torch.randint(-50, 10, (n + 3,), generator=gen).double()
    return (mantissa * torch.exp2(exponent - 23)).float()


def numeric_key() -> str:
    """A short hash of the bits of every floating-point primitive the Adam steps' continuation goes through."""
    x, y, z = _probe(1), _probe(2), _probe(3)
    h = hashlib.sha256()
    for out in (torch.sqrt(x), x.clone().sqrt_(), torch._foreach_sqrt([x])[0],  # MKL's vector sqrt
                x.clone().add_(y, alpha=0.1), x.clone().mul_(0.9).add_(y, alpha=0.1),  # FMA or not
                x.clone().addcmul_(y, y, value=0.001), x / y, x.div(3.0), (x * 0.999).add_(1e-8)):
        h.update(out.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def saved() -> dict:
    """The stored checkpoints (tests/fixtures/checkpoints/main_checkpoints.pt)."""
    return torch.load(FIXTURES / "main_checkpoints.pt", weights_only=False)


def recorded() -> dict[str, dict[str, str]]:
    """``{numeric key: {configuration name: digest}}`` as recorded."""
    return {entry["key"]: entry["digests"] for entry in json.loads(RECORDED.read_text())["continuations"]}


def loaded(name: str, state_dict: dict | None = None, configs: dict | None = None):
    """``(params, optimizer)``: today's class of stored checkpoint ``name`` with its parameters, loaded from its saved
    state (or ``state_dict``). ``configs``: the stored configurations, if already read."""
    from adam8lib import optim

    config = (configs or saved()["configs"])[name]
    params = [torch.nn.Parameter(p.clone()) for p in config["params"]]
    opt = getattr(optim, config["class"])(params, backend="torch", **config["kwargs"])
    opt.load_state_dict(config["state_dict"] if state_dict is None else state_dict)
    return params, opt


def adam_continuation(name: str) -> str:
    """Load the stored checkpoint ``name`` into today's class of that name, take the steps, digest."""
    params, opt = loaded(name)
    assert opt.state[params[0]]["step"] == builder.STEPS_BEFORE
    builder.run_steps(opt, params, builder.STEPS_BEFORE + 1, builder.STEPS_AFTER)
    return builder.digest(params, opt)


def _here() -> dict:
    from adam8lib.kernels.reference import torch_uses_fma

    return {"key": numeric_key(), "torch_uses_fma": torch_uses_fma(),
            "digests": {name: adam_continuation(name) for name, _, _ in builder.CONFIGS}}


def _portable_child() -> dict:
    """:func:`_here` in a child process under :data:`PORTABLE_ENV` (set before MKL starts)."""
    env = {**os.environ, **PORTABLE_ENV, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "tests._continuations"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"the continuation under {PORTABLE_ENV} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def continuation_digests(compute_here) -> tuple[dict[str, str] | None, dict[str, str] | None, str]:
    """``(digests computed here or in the portable child, recorded digests for that key, why)``.

    ``compute_here`` is called in this process when this machine's key has recorded digests; otherwise the
    library's Adam continuations are recomputed under ``MKL_CBWR=COMPATIBLE`` in a child process. Returns
    ``(None, None, reason)`` when no recorded key matches either way."""
    known = recorded()
    key = numeric_key()
    if key in known:
        return compute_here(), known[key], f"numeric key {key} (this process)"
    child = _portable_child()
    if child["key"] in known:
        return child["digests"], known[child["key"]], f"numeric key {child['key']} (under {PORTABLE_ENV})"
    return None, None, (f"no continuation is recorded for this machine's numeric key {key}, nor for its key "
                        f"{child['key']} under {PORTABLE_ENV} (recorded: {', '.join(known)}); the load itself is "
                        "still checked exactly by test_a_loaded_checkpoint_saves_the_same_bits")


if __name__ == "__main__":
    print(json.dumps(_here()))
