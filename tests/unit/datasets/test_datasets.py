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


def test_tsv_loader_takes_max_pairs_and_skips_a_byte_order_mark(tmp_path):
    path = tmp_path / "bom.txt"
    text = "".join(f"Go {i}.\tVa {i} !\n" for i in range(5))
    path.write_text("\ufeff" + text, encoding="utf-8")
    corpus = datasets.load_tsv(path)
    pairs = corpus.train + corpus.validation + corpus.test
    assert ("Go 0.", "Va 0 !") in pairs
    first = datasets.load_tsv(path, max_pairs=1)
    assert first.train + first.validation + first.test == [("Go 0.", "Va 0 !")]
    with pytest.raises(ValueError, match=r"load_tsv.*max_pairs=0"):
        datasets.load_tsv(path, max_pairs=0)


BAD_LOADER_ARGUMENTS = {
    "dates-locale-string": (
        datasets.load_dates,
        {"locales": "de_DE"},
        "locales='de_DE'",
    ),
    "dates-locale-unknown": (
        datasets.load_dates,
        {"locales": ("de_DE", "xx_YY")},
        "'xx_YY' in locales",
    ),
    "dates-locales-empty": (datasets.load_dates, {"locales": ()}, r"\(\)"),
    "dates-years": (
        datasets.load_dates,
        {"first_year": 2000, "last_year": 1999},
        "last_year=1999",
    ),
    "dates-year-zero": (datasets.load_dates, {"first_year": 0}, "first_year=0"),
    "dates-examples": (datasets.load_dates, {"num_examples": 0}, "=0"),
    "numbers-source": (
        datasets.load_numbers,
        {"source_language": "xx"},
        "source_language='xx'",
    ),
    "numbers-target": (
        datasets.load_numbers,
        {"target_language": "zz"},
        "target_language='zz'",
    ),
    "numbers-max-value": (
        datasets.load_numbers,
        {"max_value": -1},
        "max_value=-1",
    ),
    "numbers-examples": (
        datasets.load_numbers,
        {"num_examples": 2.5},
        "num_examples=2.5",
    ),
}


@pytest.mark.parametrize("case", BAD_LOADER_ARGUMENTS)
def test_bad_loader_arguments_are_value_errors(case):
    load, kwargs, match = BAD_LOADER_ARGUMENTS[case]
    with pytest.raises(ValueError, match=rf"{load.__name__}: .*{match}"):
        load(**{"num_examples": 10, **kwargs})


@pytest.mark.parametrize(
    "fractions", [(1.2, -0.1, -0.1), (0.5, 0.6, -0.1), (0.5, 0.5)]
)
def test_split_fractions_are_checked(fractions):
    with pytest.raises(ValueError, match=r"ParallelCorpus.*fractions="):
        datasets.ParallelCorpus.from_pairs(
            "toy", [("a", "b")], fractions=fractions
        )


def test_a_cut_text_keeps_its_end_token():
    vocab = datasets.Vocabulary.from_texts(["a b c d"])
    a, b, c, d = (vocab.index[t] for t in "abcd")
    ids = vocab.encode(["a b c d", "a"], 4, add_start=True, add_end=True)
    assert ids.tolist() == [
        [vocab.start_id, a, b, vocab.end_id],
        [vocab.start_id, a, vocab.end_id, 0],
    ]
    assert vocab.encode(["a b c d"], 2).tolist() == [[a, b]]
    assert vocab.encode(["c d"], 1, add_end=True).tolist() == [[vocab.end_id]]


def test_decode_of_a_text_is_its_tokenized_form():
    """What the translation examples score: a decoded translation equals
    `tokenized(reference)` exactly when its tokens are the reference's."""
    texts = ["C'est le mien.", "Salut !", "Il a 29 ans, non ?", "Go."]
    vocab = datasets.Vocabulary.from_texts(texts)
    for text in texts:
        ids = vocab.encode([text], add_start=True, add_end=True)[0]
        assert vocab.decode(ids[1:]) == vocab.tokenized(text)
    assert vocab.tokenized("C'est le mien.") == "C ' est le mien ."
    chars = datasets.Vocabulary.from_texts(texts, tokenizer="char")
    assert chars.tokenized("C'est le mien.") == "C'est le mien."


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda v: v.encode("ab"), "texts='ab'"),
        (lambda v: v.encode(["ab"], max_length=0), "max_length=0"),
        (lambda v: v.encode(["ab"], max_length=2.0), "max_length=2.0"),
        (lambda v: v.decode([4, 99]), r"ids in \[4, 99\]"),
        (lambda v: v.decode([-1]), r"ids in \[-1, -1\]"),
        (lambda v: v.decode([[4, 5]]), r"ids.shape=\(1, 2\)"),
        (lambda v: v.decode([4.0]), "ids.dtype=float64"),
    ],
)
def test_vocabulary_bad_input(call, match):
    vocab = datasets.Vocabulary.from_texts(["ab"], tokenizer="char")
    with pytest.raises(ValueError, match=rf"Vocabulary\.\w+: .*{match}"):
        call(vocab)
    assert vocab.decode([]) == ""
