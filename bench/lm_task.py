"""A miniature language-modelling task for convergence evidence (the paper's Table 1 LM rows).

**Corpus.** The Python standard library's own source, which every Python installation has
offline: the files named in :data:`TRAIN_FILES` and :data:`VALID_FILES` under
``sysconfig.get_paths()["stdlib"]`` (a file missing in this Python version is skipped and
the list actually used is recorded). The split is *by file*: no validation byte comes from a
file seen in training. Text is read as raw bytes (vocabulary 256, so no tokenizer); the
corpus' SHA-256 and the Python version are recorded with every result, because the stdlib
changes between Python versions.

**Model.** A GPT-2-style causal transformer from ``transformers.GPT2Config`` (no hub): 2
layers, width 128, 4 heads, context 128, byte vocabulary, tied input/output embeddings,
dropout 0 (so a run's only randomness is the seed's initialisation and data order).

**Training.** ``steps`` steps of ``batch_size`` windows of ``context + 1`` bytes drawn
uniformly from the training stream by a ``torch.Generator`` seeded with the seed: the same
initial weights and the same batches for every optimizer (paired seeds). Linear warm-up for
``warmup`` of the steps, then cosine decay to 10 % of the peak; gradient clipping at 1.0;
decoupled weight decay on the matrices only (``make_param_groups``). fp32 throughout.

**Metric.** Mean next-byte cross-entropy (nats) on ``eval_windows`` fixed windows spread
evenly over the validation stream (the same windows for every run); perplexity is its exp.
Also counted: *loss spikes* (a training step whose loss exceeds 1.5x the median of the
previous 20) and *divergence* (a non-finite loss, or a final validation loss above the
loss of the uniform guess, ln 256).

**Reproducibility.** :func:`run` sets the thread count it is given and
``torch.use_deterministic_algorithms(True)``; with the same seed and threads it returns the
same numbers (``tests/test_convergence.py`` checks it).
"""

from __future__ import annotations

import hashlib
import math
import statistics
import sysconfig
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import torch

#: Training files (paths relative to the stdlib directory). Chosen to exist in Python 3.10–3.13.
TRAIN_FILES = (
    "argparse.py", "ast.py", "base64.py", "bisect.py", "calendar.py", "cmd.py", "codecs.py",
    "collections/__init__.py", "configparser.py", "contextlib.py", "copy.py", "csv.py",
    "dataclasses.py", "datetime.py", "difflib.py", "enum.py", "fnmatch.py", "fractions.py",
    "functools.py", "getopt.py", "gettext.py", "glob.py", "gzip.py", "heapq.py", "hmac.py",
    "inspect.py", "ipaddress.py", "locale.py", "logging/__init__.py", "numbers.py",
    "operator.py", "optparse.py", "os.py", "pprint.py", "random.py", "reprlib.py", "sched.py",
    "secrets.py", "selectors.py", "shutil.py", "string.py", "subprocess.py", "tempfile.py",
    "threading.py", "tokenize.py", "traceback.py", "typing.py", "uuid.py", "warnings.py",
    "weakref.py", "zipfile.py",
)
#: Validation files: never trained on.
VALID_FILES = ("statistics.py", "textwrap.py", "shlex.py", "queue.py", "tarfile.py", "decimal.py")

VOCAB = 256
UNIFORM_LOSS = math.log(VOCAB)


@dataclass(frozen=True)
class LMConfig:
    """Everything that defines one run except the optimizer and the seed."""

    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 4
    context: int = 128
    batch_size: int = 8
    steps: int = 250
    lr: float = 2e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.98)
    warmup: float = 0.1
    clip: float = 1.0
    eval_windows: int = 128


# ---------------------------------------------------------------------- corpus
def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


@lru_cache(maxsize=None)
def load_corpus(root: str | None = None) -> dict[str, Any]:
    """The byte streams: ``{"train": uint8 tensor, "valid": uint8 tensor, "files": ..., "sha256": ...}``.

    Files are concatenated in the listed order, each followed by a newline.
    """
    base = Path(root) if root else stdlib_dir()
    out: dict[str, Any] = {"stdlib": str(base), "files": {}, "missing": []}
    digest = hashlib.sha256()
    for split, names in (("train", TRAIN_FILES), ("valid", VALID_FILES)):
        chunks, used = [], []
        for name in names:
            path = base / name
            if not path.is_file():
                out["missing"].append(name)
                continue
            data = path.read_bytes() + b"\n"
            digest.update(split.encode() + name.encode() + b"\0" + data)
            chunks.append(data)
            used.append(name)
        if not chunks:
            raise FileNotFoundError(f"none of the {split} files were found under {base}")
        blob = b"".join(chunks)
        out[split] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
        out["files"][split] = used
    out["sha256"] = digest.hexdigest()
    out["bytes"] = {"train": int(out["train"].numel()), "valid": int(out["valid"].numel())}
    return out


# ---------------------------------------------------------------------- model
def build_model(cfg: LMConfig, seed: int):
    """GPT-2-style causal LM from config, initialised from ``seed`` (no download)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB, n_positions=cfg.context, n_embd=cfg.n_embd, n_layer=cfg.n_layer, n_head=cfg.n_head,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    model.config.use_cache = False
    return model


def batches(stream: torch.Tensor, cfg: LMConfig, seed: int):
    """``cfg.steps`` batches of ``(batch_size, context + 1)`` windows; offsets from the seed only."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    high = stream.numel() - cfg.context - 1
    idx = torch.arange(cfg.context + 1)
    for _ in range(cfg.steps):
        starts = torch.randint(0, high, (cfg.batch_size,), generator=gen)
        yield stream[starts[:, None] + idx].long()


def eval_batch(stream: torch.Tensor, cfg: LMConfig) -> torch.Tensor:
    """The fixed validation windows: ``eval_windows`` windows spread evenly over the stream."""
    high = stream.numel() - cfg.context - 1
    starts = torch.linspace(0, high, cfg.eval_windows).long()
    return stream[starts[:, None] + torch.arange(cfg.context + 1)].long()


def lm_loss(model, windows: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=windows[:, :-1]).logits.float()  # (a bf16 model's logits: the loss in fp32)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), windows[:, 1:].reshape(-1))


@torch.no_grad()
def validation_loss(model, windows: torch.Tensor, chunk: int = 32) -> float:
    model.eval()
    total = sum(float(lm_loss(model, windows[i:i + chunk])) * len(windows[i:i + chunk])
                for i in range(0, len(windows), chunk))
    model.train()
    return total / len(windows)


def lr_at(step: int, cfg: LMConfig) -> float:
    """Multiplier of the peak lr at 0-based ``step``: linear warm-up, cosine decay to 0.1."""
    warm = max(1, math.ceil(cfg.warmup * cfg.steps))
    if step < warm:
        return (step + 1) / warm
    progress = (step - warm) / max(1, cfg.steps - warm)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def count_spikes(losses: list[float], window: int = 20, factor: float = 1.5) -> int:
    """Steps whose loss exceeds ``factor`` x the median of the previous ``window`` losses
    (a non-finite loss counts as a spike)."""
    spikes = 0
    for i in range(window, len(losses)):
        if not math.isfinite(losses[i]):
            spikes += 1
            continue
        if losses[i] > factor * statistics.median(losses[i - window:i]):
            spikes += 1
    return spikes


# ---------------------------------------------------------------------- one run
def set_determinism(threads: int) -> None:
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def run(make_optimizer: Callable[[list[dict[str, Any]], LMConfig], torch.optim.Optimizer], seed: int,
        cfg: LMConfig = LMConfig(), *, threads: int = 1, eval_every: int = 0, release: bool = False) -> dict[str, Any]:
    """Train one model with the optimizer ``make_optimizer(param_groups, cfg)`` and return the record.

    ``eval_every > 0`` also records the validation loss every that many steps (for curves).
    ``release=True`` steps every parameter inside backward (``adam8lib.release_gradients``), with the
    same global-norm clipping in two backward passes (``ReleaseHandle.backward_clipped``).
    """
    from adam8lib.training import make_param_groups

    set_determinism(threads)
    corpus = load_corpus()
    valid = eval_batch(corpus["valid"], cfg)
    model = build_model(cfg, seed)
    opt = make_optimizer(make_param_groups(model, cfg.weight_decay), cfg)
    peak = [g["lr"] for g in opt.param_groups]
    if release:
        from adam8lib import release_gradients

        handle = release_gradients(model, opt)
    losses: list[float] = []
    curve: list[tuple[int, float]] = []
    start = time.perf_counter()
    diverged = False
    for step, batch in enumerate(batches(corpus["train"], cfg, seed)):
        for g, base in zip(opt.param_groups, peak):
            g["lr"] = base * lr_at(step, cfg)
        loss = lm_loss(model, batch)
        if release:  # every parameter stepped inside backward, its gradient freed
            handle.backward_clipped(loss, cfg.clip) if cfg.clip else loss.backward()
        else:
            loss.backward()
            if cfg.clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
        value = float(loss.detach())
        losses.append(value)
        if not math.isfinite(value):
            diverged = True
            break
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < cfg.steps:
            curve.append((step + 1, validation_loss(model, valid)))
    seconds = time.perf_counter() - start
    final = validation_loss(model, valid) if not diverged else float("nan")
    if not diverged:
        curve.append((cfg.steps, final))
    diverged = diverged or not math.isfinite(final) or final > UNIFORM_LOSS
    return {
        "seed": seed, "threads": threads, "valid_loss": final,
        "valid_ppl": math.exp(min(final, 700.0)) if math.isfinite(final) else float("nan"),  # no overflow
        "train_loss_last50": statistics.fmean(losses[-50:]), "spikes": count_spikes(losses),
        "diverged": diverged, "seconds": seconds, "loss": losses, "valid_curve": curve,
    }


def describe(cfg: LMConfig) -> dict[str, Any]:
    """The task's record: config, corpus (files, bytes, hash) and parameter count."""
    corpus = load_corpus()
    model = build_model(cfg, 0)
    return {
        "task": "byte-level causal LM on the Python standard library's source",
        "config": asdict(cfg),
        "parameters": sum(p.numel() for p in model.parameters()),
        "corpus": {k: corpus[k] for k in ("stdlib", "files", "missing", "sha256", "bytes")},
        "tokens_seen": cfg.steps * cfg.batch_size * cfg.context,
    }
