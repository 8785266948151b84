"""The spelled-digits task with known alignments and the alignment error
rate."""

import doctest

import numpy as np
import pytest

from keras_attention import datasets
from keras_attention.datasets import alignment

NAMES = {
    "en": ["zero", "one", "two", "three", "four"]
    + ["five", "six", "seven", "eight", "nine"],
    "de": ["null", "eins", "zwei", "drei", "vier"]
    + ["fünf", "sechs", "sieben", "acht", "neun"],
}


def test_same_seed_same_pairs():
    first = datasets.load_spelled_digits(200, seed=3)
    assert first == datasets.load_spelled_digits(200, seed=3)
    assert first != datasets.load_spelled_digits(200, seed=4)
    assert len(first) == 200
    assert all(isinstance(p, datasets.AlignedPair) for p in first)


def test_lengths_and_digits_are_uniform_in_range():
    pairs = datasets.load_spelled_digits(2000, min_length=2, max_length=5)
    lengths = [len(p.source) for p in pairs]
    assert set(lengths) == {2, 3, 4, 5}
    assert max(np.bincount(lengths)[2:]) < 1.25 * min(np.bincount(lengths)[2:])
    digits = [d for p in pairs for d in p.source]
    assert sorted(set(digits)) == list("0123456789")
    exact = datasets.load_spelled_digits(50, min_length=7, max_length=7)
    assert {len(p.source) for p in exact} == {7}


@pytest.mark.parametrize("language", ["en", "de"])
def test_alignment_is_consistent(language):
    names = NAMES[language]
    for pair in datasets.load_spelled_digits(300, language=language, seed=1):
        assert len(pair.alignment) == len(pair.target)
        assert list(pair.alignment) == sorted(pair.alignment)
        assert pair.alignment[0] == 0
        assert pair.alignment[-1] == len(pair.source) - 1
        words = "".join(pair.target).split(" ")
        assert words == [names[int(d)] for d in pair.source]
        for char, index in zip(pair.target, pair.alignment, strict=True):
            name = names[int(pair.source[index])]
            # A space belongs to the digit before it.
            assert char == " " or char in name
        for t, char in enumerate(pair.target):
            if char == " ":
                assert pair.alignment[t + 1] == pair.alignment[t] + 1


def test_golden_pair():
    pair = datasets.load_spelled_digits(1, min_length=3, max_length=3)[0]
    assert pair == datasets.AlignedPair(
        source=("6", "0", "4"),
        target=tuple("six zero four"),
        alignment=(0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2),
    )
    one = datasets.load_spelled_digits(1, min_length=1, max_length=1, seed=5)
    (pair,) = one
    assert "".join(pair.target) == NAMES["en"][int(pair.source[0])]
    assert set(pair.alignment) == {0}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_examples": 0}, "num_examples=0"),
        ({"num_examples": 2.5}, "num_examples=2.5"),
        ({"min_length": 0}, "min_length=0"),
        ({"min_length": 4, "max_length": 3}, "max_length=3"),
        ({"max_length": True}, "max_length=True"),
        ({"language": "xx"}, "language='xx'"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=rf"load_spelled_digits.*{match}"):
        datasets.load_spelled_digits(**kwargs)


def test_aligned_pair_checks_its_alignment():
    with pytest.raises(ValueError, match=r"AlignedPair.*alignment=\(0, 2\)"):
        datasets.AlignedPair(("1", "2"), ("o", "t"), (0, 2))
    with pytest.raises(ValueError, match="for 2 target tokens"):
        datasets.AlignedPair(("1",), ("o", "n"), (0,))


def test_error_rate_golden_values():
    weights = np.zeros((2, 3, 4))
    weights[0, :, :] = np.eye(4)[[0, 1, 1]]  # peaks at 0, 1, 1
    weights[1, :, :] = np.eye(4)[[3, 2, 0]]  # peaks at 3, 2, 0
    references = np.array([[0, 1, 2], [3, 2, -1]])
    # Wrong: (0, 2) only, of the five tokens with a reference.
    assert datasets.alignment_error_rate(weights, references) == 0.2
    mask = np.array([[True, True, False], [True, True, True]])
    assert datasets.alignment_error_rate(weights, references, mask) == 0.0
    # Reversed references [[2, 1, 0], [-1, 2, 3]]: 3 of 5 wrong.
    assert datasets.alignment_error_rate(weights, references[:, ::-1]) == 0.6
    peaks = np.array([[0, 1, 1], [3, 2, 0]])
    assert datasets.alignment_error_rate(weights, (peaks + 1) % 4) == 1.0
    # Ties go to the first position, as np.argmax does.
    tied = np.full((1, 1, 3), 1 / 3)
    assert datasets.alignment_error_rate(tied, np.array([[0]])) == 0.0
    assert datasets.alignment_error_rate(tied, np.array([[2]])) == 1.0


BAD_INPUTS = {
    r"weights.shape=\(2, 3\)": ((2, 3), np.zeros((2, 3), int), None),
    r"alignments.shape=\(2, 4\)": ((2, 3, 4), np.zeros((2, 4), int), None),
    "alignments.dtype=float64": ((1, 2, 4), np.zeros((1, 2)), None),
    r"in \[0, 4\]": ((1, 2, 4), np.array([[0, 4]]), None),
    r"in \[-2, 0\]": ((1, 2, 4), np.array([[-2, 0]]), None),
    "no target token": ((1, 2, 4), np.array([[-1, -1]]), None),
    "1 non-finite values": ((1, 2, 4), np.array([[0, 1]]), "nan"),
    r"target_mask.shape=\(2, 1\)": (
        (1, 2, 4),
        np.array([[0, 1]]),
        np.ones((2, 1), bool),
    ),
}


@pytest.mark.parametrize("match", BAD_INPUTS)
def test_error_rate_bad_inputs(match):
    shape, references, mask = BAD_INPUTS[match]
    weights = np.zeros(shape)
    if isinstance(mask, str):  # one NaN weight: no alignment can be read
        weights.flat[3], mask = np.nan, None
    with pytest.raises(ValueError, match=rf"alignment_error_rate.*{match}"):
        datasets.alignment_error_rate(weights, references, mask)


def test_docstring_examples_run():
    result = doctest.testmod(
        alignment,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
        verbose=False,
    )
    assert result.failed == 0 and result.attempted >= 3
