"""A synthetic task with known alignments, and the alignment error rate.

Spelled-out digits: the source is a digit string, the target the digits'
names, character by character. Every target character comes from one
source digit, so the reference alignment is known exactly and an
attention map can be scored against it. The alignment is monotonic, each
digit yields several characters (three for "one", five for "three") and
digits repeat, so content alone cannot tell a model where in the source
it is; training on short strings and testing on longer ones measures
length generalisation, the use that location-sensitive (Chorowski et al.
2015) and monotonic (Raffel et al. 2017) attention were made for.

Shape legend: N examples, T target length, S source length.
"""

import dataclasses
import random

import numpy as np

from keras_attention.datasets._checks import check_integer
from keras_attention.datasets._checks import speller


@dataclasses.dataclass(frozen=True)
class AlignedPair:
    """Source and target tokens with the reference alignment.

    Attributes:
        source (tuple[str, ...]): The source tokens.
        target (tuple[str, ...]): The target tokens.
        alignment (tuple[int, ...]): For each target token, the index of
            the source token it comes from.

    Examples:
        >>> pair = AlignedPair(("4", "2"), tuple("four two"),
        ...                    (0, 0, 0, 0, 0, 1, 1, 1))
        >>> [pair.source[i] for i in pair.alignment[4:]]
        ['4', '2', '2', '2']
    """

    source: tuple
    target: tuple
    alignment: tuple

    def __post_init__(self):
        if len(self.alignment) != len(self.target) or any(
            not 0 <= i < len(self.source) for i in self.alignment
        ):
            raise ValueError(
                "AlignedPair: `alignment` must hold one source index in "
                f"[0, {len(self.source)}) per target token. Received: "
                f"alignment={self.alignment!r} for {len(self.target)} "
                "target tokens"
            )


def load_spelled_digits(
    num_examples: int = 10000,
    min_length: int = 1,
    max_length: int = 8,
    language: str = "en",
    seed: int = 0,
) -> list:
    """Digit strings to the characters of the digits' names.

    The source `("3", "1", "4")` becomes the target `"three one four"`,
    one token per character, a space `" "` between names. Digits are
    drawn uniformly and the length uniformly in `[min_length,
    max_length]`. Each character is aligned to its digit and each space to
    the digit before it, so the reference alignment is monotonic, with
    three to five target tokens per digit in English.

    Train with `max_length=L`, then test with `min_length = max_length =
    2 * L` to measure how an attention mechanism generalises to longer
    sources than it was trained on.

    Args:
        num_examples: Pairs drawn (repeats are kept).
        min_length: Fewest digits in a source.
        max_length: Most digits in a source.
        language: A num2words language code for the digit names.
        seed: Same seed, same pairs.

    Returns:
        list[AlignedPair]: `num_examples` pairs.

    Examples:
        >>> pair = load_spelled_digits(1, min_length=3, max_length=3)[0]
        >>> "".join(pair.source), "".join(pair.target)
        ('604', 'six zero four')
        >>> pair.alignment
        (0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2)
    """
    where = "load_spelled_digits"
    check_integer(where, "num_examples", num_examples, 1)
    check_integer(where, "min_length", min_length, 1)
    check_integer(where, "max_length", max_length, min_length)
    spell = speller(where, "language", language)
    names = [spell(digit) for digit in range(10)]
    rng = random.Random(seed)
    pairs = []
    for _ in range(num_examples):
        length = rng.randint(min_length, max_length)
        digits = [rng.randrange(10) for _ in range(length)]
        target, alignment = [], []
        for i, digit in enumerate(digits):
            if i:
                target.append(" ")
                alignment.append(i - 1)
            target += names[digit]
            alignment += [i] * len(names[digit])
        pairs.append(
            AlignedPair(
                tuple(str(d) for d in digits), tuple(target), tuple(alignment)
            )
        )
    return pairs


def alignment_error_rate(weights, alignments, target_mask=None) -> float:
    """The fraction of target tokens whose attention peaks on a wrong
    source token.

    For each reference target token, the source position of the largest
    weight (the first one on ties) is compared with the reference; a row
    of zeros (attention that stopped nowhere, as monotonic attention may)
    attends to no position and counts as wrong:

    $$\\operatorname{AER} = \\frac{1}{|R|} \\sum_{(n, t) \\in R}
    [\\operatorname{argmax}_s \\alpha_{n,t,s} \\neq a_{n,t}]$$

    where R holds the target tokens with a reference (`a >= 0`, and
    `target_mask` true where given).

    Args:
        weights (np.ndarray): Shape `(N, T, S)`, the attention weights of
            each target token over the source.
        alignments (np.ndarray): Shape `(N, T)`, integer: each target
            token's reference source index, or `-1` where there is none
            (padding, an end token).
        target_mask (np.ndarray | None): Shape `(N, T)`, boolean: the
            target tokens to count. Defaults to all with a reference.

    Returns:
        float: The error rate, in `[0, 1]`.

    Examples:
        >>> import numpy as np
        >>> weights = np.array([[[0.9, 0.1], [0.6, 0.4], [0.2, 0.8]]])
        >>> alignment_error_rate(weights, np.array([[0, 1, 1]]))
        0.3333333333333333
        >>> alignment_error_rate(weights, np.array([[0, -1, 1]]))
        0.0
        >>> alignment_error_rate(np.zeros((1, 1, 2)), np.array([[0]]))
        1.0
    """
    where = "alignment_error_rate"
    weights = np.asarray(weights)
    alignments = np.asarray(alignments)
    if weights.ndim != 3 or alignments.shape != weights.shape[:2]:
        raise ValueError(
            f"{where}: `weights` must be (N, T, S) and `alignments` (N, T). "
            f"Received: weights.shape={weights.shape}, "
            f"alignments.shape={alignments.shape}"
        )
    if weights.dtype.kind not in "biuf" or not np.all(np.isfinite(weights)):
        raise ValueError(
            f"{where}: `weights` must be finite numbers (a diverged model's "
            "NaN attention peaks nowhere). Received: weights with "
            f"{_non_finite(weights)}"
        )
    if not np.issubdtype(alignments.dtype, np.integer):
        raise ValueError(
            f"{where}: `alignments` must hold integer source indices. "
            f"Received: alignments.dtype={alignments.dtype}"
        )
    source_length = weights.shape[2]
    if alignments.size and (
        alignments.min() < -1 or alignments.max() >= source_length
    ):
        raise ValueError(
            f"{where}: `alignments` must be -1 or a source index in "
            f"[0, {source_length}). Received: alignments in "
            f"[{alignments.min()}, {alignments.max()}]"
        )
    reference = alignments >= 0  # (N, T)
    if target_mask is not None:
        target_mask = np.asarray(target_mask)
        if target_mask.shape != alignments.shape:
            raise ValueError(
                f"{where}: `target_mask` must be (N, T) like `alignments`. "
                f"Received: target_mask.shape={target_mask.shape}, "
                f"alignments.shape={alignments.shape}"
            )
        reference &= target_mask.astype(bool)
    count = int(reference.sum())
    if not count:
        raise ValueError(
            f"{where}: no target token has a reference alignment. "
            f"Received: alignments.shape={alignments.shape}"
        )
    peak = weights.argmax(axis=-1)  # (N, T)
    nowhere = weights.max(axis=-1) <= 0  # (N, T)
    wrong = ((peak != alignments) | nowhere) & reference
    return float(wrong.sum() / count)


def _non_finite(weights) -> str:
    if weights.dtype.kind not in "biuf":
        return f"dtype={weights.dtype}"
    return f"{int(np.sum(~np.isfinite(weights)))} non-finite values"
