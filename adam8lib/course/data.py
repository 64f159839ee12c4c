"""Data for lesson 10: GLUE MRPC when the hub is reachable, a shipped paraphrase task when not.

MRPC (Microsoft Research Paraphrase Corpus, part of GLUE) asks: do two sentences say the
same thing? Rows have ``sentence1``, ``sentence2``, ``label`` (1 = paraphrase) and ``idx``.

Offline (CI, this course's CPU runs) we use **synpara**, a synthetic paraphrase task with the
same columns, written by :func:`generate_pairs` (deterministic, standard library only) and
shipped as ``adam8lib/course/datafiles/synpara.jsonl.gz`` with a WordPiece tokenizer built from it
(``adam8lib/course/datafiles/synpara-tokenizer.json``). Each sentence describes one event (who,
did what, to which object) in the active or the passive voice, with verb synonyms
("bought"/"purchased"). A pair is a paraphrase when both sentences describe the same event;
a non-paraphrase changes one to three of the slots. A model must match content across a
change of word order and synonyms. A small DistilBERT trained from scratch (no pretrained
weights offline) climbs from chance to about 80% accuracy in a few hundred steps on a CPU,
so accuracy, F1 and the optimizer comparison mean something — and it is not yet solved,
so differences between optimizers can show.

Regenerate the files (byte-identical) with ``python -m adam8lib.course.data``. Licence: the
generator and the data it writes are part of this repository (MIT, see pyproject.toml).
"""

from __future__ import annotations

import gzip
import json
import os
import random
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = [
    "DATA_DIR",
    "SYNPARA_FILE",
    "TOKENIZER_FILE",
    "SPLITS",
    "generate_pairs",
    "write_synpara",
    "read_synpara",
    "train_tokenizer",
    "offline_tokenizer",
    "hub_available",
    "load_pairs",
    "load_tokenizer",
    "tokenize_pairs",
    "load_task",
]

DATA_DIR = Path(__file__).with_name("datafiles")
SYNPARA_FILE = DATA_DIR / "synpara.jsonl.gz"
TOKENIZER_FILE = DATA_DIR / "synpara-tokenizer.json"
#: Split sizes of the shipped task (MRPC has 3,668 train / 408 validation pairs).
SPLITS = {"train": 4000, "validation": 1000}
SEED = 2024
HUB_MODEL = "distilbert-base-cased"
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# ---------------------------------------------------------------------- the synthetic task
_NAMES = ["Alice", "Bruno", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana"]
_OBJECTS = ["bicycle", "camera", "guitar", "laptop", "lamp", "painting", "piano", "radio"]
# each verb: (past-tense synonyms, past-participle synonyms) — same index, same meaning
_VERBS = [
    (["bought", "purchased"], ["bought", "purchased"]),
    (["sold", "auctioned off"], ["sold", "auctioned off"]),
    (["repaired", "fixed"], ["repaired", "fixed"]),
    (["painted", "repainted"], ["painted", "repainted"]),
    (["borrowed", "took on loan"], ["borrowed", "taken on loan"]),
    (["cleaned", "polished"], ["cleaned", "polished"]),
    (["stole", "pinched"], ["stolen", "pinched"]),
    (["found", "discovered"], ["found", "discovered"]),
]
_SLOTS = ("name", "verb", "object")
_SIZES = {"name": len(_NAMES), "verb": len(_VERBS), "object": len(_OBJECTS)}


def _sentence(event: dict[str, int], rng: random.Random) -> str:
    """One surface form of an event: active or passive voice, with a random verb synonym."""
    name, obj = _NAMES[event["name"]], _OBJECTS[event["object"]]
    past, participle = _VERBS[event["verb"]]
    if rng.randrange(2) == 0:
        return f"{name} {rng.choice(past)} the {obj}."
    return f"The {obj} was {rng.choice(participle)} by {name}."


def generate_pairs(n: int, seed: int = SEED) -> list[dict[str, Any]]:
    """``n`` sentence pairs (half paraphrases), deterministic in ``seed``.

    A negative pair changes 1, 2 or 3 of the event's slots (uniformly), so some are easy
    (a different event altogether) and some hard (only the verb differs, under synonyms and a
    change of voice). Rows: ``{"sentence1", "sentence2", "label", "idx"}`` like GLUE MRPC.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    rng = random.Random(seed)
    rows = []
    for idx in range(n):
        event = {slot: rng.randrange(size) for slot, size in _SIZES.items()}
        label = idx % 2  # exactly balanced; the order is shuffled below
        other = dict(event)
        if label == 0:
            for slot in rng.sample(_SLOTS, rng.randint(1, len(_SLOTS))):
                other[slot] = (event[slot] + rng.randrange(1, _SIZES[slot])) % _SIZES[slot]
        rows.append({"sentence1": _sentence(event, rng), "sentence2": _sentence(other, rng), "label": label})
    rng.shuffle(rows)
    return [{**row, "idx": i} for i, row in enumerate(rows)]


def write_synpara(path: str | os.PathLike = SYNPARA_FILE, seed: int = SEED) -> Path:
    """Write the shipped splits as gzipped JSON lines (``{"split": ..., **row}``), byte-stable."""
    path = Path(path)
    rows = generate_pairs(sum(SPLITS.values()), seed=seed)
    lines, start = [], 0
    for split, size in SPLITS.items():
        for row in rows[start:start + size]:
            lines.append(json.dumps({"split": split, **row}, ensure_ascii=False, sort_keys=True))
        start += size
    payload = ("\n".join(lines) + "\n").encode()
    # mtime=0 and no file name in the header: the same bytes on every run
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
        f.write(payload)
    return path


def read_synpara(path: str | os.PathLike = SYNPARA_FILE) -> dict[str, list[dict[str, Any]]]:
    """The shipped splits as ``{"train": [rows], "validation": [rows]}``."""
    splits: dict[str, list[dict[str, Any]]] = {name: [] for name in SPLITS}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            splits[row.pop("split")].append(row)
    return splits


# ---------------------------------------------------------------------- tokenizer
def train_tokenizer(texts: list[str]):
    """A cased WordPiece tokenizer for ``texts`` (BERT-style pre-tokenizer, ``[CLS] a [SEP] b [SEP]``).

    The vocabulary is built, not sampled: the special tokens, then every word of ``texts``
    (sorted), then each character alone and as a ``##`` continuation, so an unseen word is
    spelled out instead of becoming ``[UNK]``. The same texts always give the same file
    (``tokenizers``' WordPiece trainer breaks ties in hash order, which differs per run).
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    pre = pre_tokenizers.BertPreTokenizer()
    words: set[str] = set()
    for text in texts:
        words.update(w for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(text)))
    chars = sorted({c for w in words for c in w})
    vocab: dict[str, int] = {}
    for token in SPECIAL_TOKENS + sorted(words) + chars + [f"##{c}" for c in chars]:
        vocab.setdefault(token, len(vocab))
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.WordPiece()
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return tok


def _wrap(tok):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]", model_input_names=["input_ids", "attention_mask"], model_max_length=128,
    )


def offline_tokenizer(path: str | os.PathLike = TOKENIZER_FILE):
    """The shipped synpara WordPiece tokenizer as a ``transformers`` fast tokenizer."""
    from tokenizers import Tokenizer

    return _wrap(Tokenizer.from_file(str(path)))


# ---------------------------------------------------------------------- hub or offline
@lru_cache(maxsize=None)
def hub_available(timeout: float = 1.5) -> bool:
    """True when the Hugging Face hub answers (Colab); False offline or with ``HF_HUB_OFFLINE=1``.

    A TCP connect with a short timeout: offline it fails fast instead of hanging in retries.
    """
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        return False
    import socket

    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout):
            return True
    except OSError:
        return False


def _resolve(source: str) -> str:
    if source not in ("auto", "hub", "offline"):
        raise ValueError(f"source must be 'auto', 'hub' or 'offline', got {source!r}")
    if source == "auto":
        return "hub" if hub_available() else "offline"
    return source


def load_pairs(source: str = "auto"):
    """``datasets.DatasetDict`` with ``train`` and ``validation`` splits of sentence pairs.

    ``source="hub"``: GLUE MRPC; ``"offline"``: the shipped synpara task; ``"auto"``: MRPC when
    the hub is reachable, else synpara.
    """
    from datasets import Dataset, DatasetDict, load_dataset

    if _resolve(source) == "hub":
        mrpc = load_dataset("glue", "mrpc")
        return DatasetDict(train=mrpc["train"], validation=mrpc["validation"])
    return DatasetDict({name: Dataset.from_list(rows) for name, rows in read_synpara().items()})


def load_tokenizer(source: str = "auto"):
    """distilbert-base-cased's tokenizer from the hub, or the shipped synpara tokenizer."""
    if _resolve(source) == "hub":
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(HUB_MODEL)
    return offline_tokenizer()


def tokenize_pairs(dataset, tokenizer, max_length: int = 128):
    """Tokenize ``sentence1``/``sentence2`` pairs (no padding: a collator pads each batch).

    Keeps ``input_ids``, ``attention_mask`` and ``labels``; drops the text columns.
    """
    def encode(batch):
        return tokenizer(batch["sentence1"], batch["sentence2"], truncation=True, max_length=max_length)

    columns = [c for c in dataset["train"].column_names if c != "label"] if hasattr(dataset, "keys") else \
        [c for c in dataset.column_names if c != "label"]
    out = dataset.map(encode, batched=True, remove_columns=columns)
    return out.rename_column("label", "labels")


def load_task(source: str = "auto", max_length: int = 128):
    """``(tokenized DatasetDict, tokenizer, name)`` — name is ``"glue/mrpc"`` or ``"synpara"``."""
    source = _resolve(source)
    tokenizer = load_tokenizer(source)
    data = tokenize_pairs(load_pairs(source), tokenizer, max_length=max_length)
    return data, tokenizer, ("glue/mrpc" if source == "hub" else "synpara")


def _write_all() -> None:
    DATA_DIR.mkdir(exist_ok=True)
    write_synpara()
    rows = read_synpara()["train"]
    tok = train_tokenizer([text for row in rows for text in (row["sentence1"], row["sentence2"])])
    tok.save(str(TOKENIZER_FILE), pretty=True)
    print(f"wrote {SYNPARA_FILE} and {TOKENIZER_FILE} (vocab {tok.get_vocab_size()})")


if __name__ == "__main__":
    _write_all()
