"""Built-in corpora, the TSV loader and vocabularies."""

import numpy as np
import pytest

from keras_attention import datasets


def test_dates_are_deterministic_and_correct():
    first = datasets.load_dates(500, seed=3)
    again = datasets.load_dates(500, seed=3)
    other = datasets.load_dates(500, seed=4)
    assert first == again
    assert first.train != other.train
    for source, target in first.train[:50]:
        year, _, day = map(int, target.split("-"))
        assert str(year) in source and str(day) in source


def test_splits_do_not_share_sources():
    corpus = datasets.load_numbers(3000, max_value=999, seed=0)
    train = {s for s, _ in corpus.train}
    assert not train & {s for s, _ in corpus.test}
    assert not train & {s for s, _ in corpus.validation}
    total = len(corpus.train) + len(corpus.validation) + len(corpus.test)
    assert len(corpus.test) == pytest.approx(0.1 * total, abs=2)


def test_numbers_reorder_between_german_and_english():
    corpus = datasets.load_numbers(400, max_value=99, seed=1)
    pairs = dict(corpus.train + corpus.validation + corpus.test)
    assert pairs["vierundzwanzig"] == "twenty-four"
    digits = datasets.load_numbers(50, target_language="digits", seed=1)
    source, target = digits.train[0]
    from num2words import num2words

    assert num2words(int(target), lang="de") == source


def test_source_length_filter():
    corpus = datasets.load_dates(400, seed=0)
    short = corpus.filter(3, tokenize=datasets.word_tokens)
    assert all(len(datasets.word_tokens(s)) <= 3 for s, _ in short.train)
    assert 0 < len(short.train) < len(corpus.train)


def test_tsv_loader(tmp_path):
    path = tmp_path / "fra.txt"
    lines = [
        f"Go {i}.\tVa {i} !\tCC-BY 2.0 (France) Attribution" for i in range(30)
    ]
    path.write_text("\n".join(lines + ["", "broken line"]), encoding="utf-8")
    corpus = datasets.load_tsv(path)
    pairs = corpus.train + corpus.validation + corpus.test
    assert len(pairs) == 30
    assert ("Go 7.", "Va 7 !") in pairs
    empty = tmp_path / "empty.txt"
    empty.write_text("no tabs here\n")
    with pytest.raises(ValueError, match="empty.txt"):
        datasets.load_tsv(empty)


def test_vocabulary_round_trip():
    vocab = datasets.Vocabulary.from_texts(["29. November 2026", "1. Mai 2001"])
    ids = vocab.encode(["29. Mai 2026", "Juni"], add_start=True, add_end=True)
    assert ids.shape == (2, 6)
    assert ids[1, 1] == vocab.index[vocab.UNK]
    assert np.all(ids[1, 4:] == 0)
    assert vocab.decode(ids[0, 1:]) == "29 . Mai 2026"
    chars = datasets.Vocabulary.from_texts(["2026-11-29"], tokenizer="char")
    assert chars.decode(chars.encode(["2026-11-29"])[0]) == "2026-11-29"
    with pytest.raises(ValueError, match="tokenizer='bpe'"):
        datasets.Vocabulary([], tokenizer="bpe")
