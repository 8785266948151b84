"""Token vocabularies: text to padded id arrays and back.

Written here rather than taken from `keras.layers.StringLookup`, which
needs TensorFlow at run time: this works with any Keras backend installed.
"""

import collections
import re

import numpy as np

from keras_attention._core.checks import positive_integer

_WORDS = re.compile(r"\w+|[^\w\s]")


def word_tokens(text: str) -> list:
    """Splits text into words and single punctuation marks.

    Args:
        text: The text to split.

    Returns:
        The words and punctuation marks, in order.

    Examples:
        >>> word_tokens("29. November 2026")
        ['29', '.', 'November', '2026']
    """
    return _WORDS.findall(text)


def char_tokens(text: str) -> list:
    """Splits text into characters, spaces included.

    Args:
        text: The text to split.

    Returns:
        The characters, in order.

    Examples:
        >>> char_tokens("2026-11")
        ['2', '0', '2', '6', '-', '1', '1']
    """
    return list(text)


class Vocabulary:
    """Maps tokens to ids with `<pad>` = 0, `<unk>`, `<start>` and `<end>`.

    Args:
        tokens (list[str]): The tokens after the four special ones.
        tokenizer: How texts are split: `"word"` or `"char"`.

    Examples:
        >>> vocab = Vocabulary.from_texts(["ab", "ba"], tokenizer="char")
        >>> ids = vocab.encode(["ab"], add_start=True, add_end=True)
        >>> ids.tolist()
        [[2, 4, 5, 3]]
        >>> vocab.decode(ids[0])
        'ab'
    """

    PAD, UNK, START, END = "<pad>", "<unk>", "<start>", "<end>"

    def __init__(self, tokens, tokenizer: str = "word"):
        if tokenizer not in ("word", "char"):
            raise ValueError(
                "Vocabulary: `tokenizer` must be 'word' or 'char'. "
                f"Received: tokenizer={tokenizer!r}"
            )
        self.tokenizer = tokenizer
        self.tokens = [self.PAD, self.UNK, self.START, self.END, *tokens]
        self.index = {token: i for i, token in enumerate(self.tokens)}

    @classmethod
    def from_texts(cls, texts, tokenizer: str = "word", min_count: int = 1):
        """Builds a vocabulary of the tokens seen at least `min_count` times,
        most frequent first (ties alphabetical)."""
        split = char_tokens if tokenizer == "char" else word_tokens
        counts = collections.Counter(t for text in texts for t in split(text))
        kept = sorted(
            (t for t, c in counts.items() if c >= min_count),
            key=lambda t: (-counts[t], t),
        )
        return cls(kept, tokenizer)

    def __len__(self):
        return len(self.tokens)

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def start_id(self) -> int:
        return self.index[self.START]

    @property
    def end_id(self) -> int:
        return self.index[self.END]

    def split(self, text: str) -> list:
        """The tokens of `text`."""
        return (
            char_tokens(text) if self.tokenizer == "char" else word_tokens(text)
        )

    def encode(self, texts, max_length=None, add_start=False, add_end=False):
        """Encodes texts to an int32 array `(N, L)` padded with 0.

        Args:
            texts (list[str]): The texts to encode.
            max_length (int | None): Pad or cut to this length. Defaults to
                the longest encoded text. A cut text keeps its `<end>`
                (with `add_end`), so a model trained on it still learns to
                stop.
            add_start (bool): Prepend `<start>`.
            add_end (bool): Append `<end>`.
        """
        if isinstance(texts, str):
            raise ValueError(
                "Vocabulary.encode: `texts` must be a list of texts, not one "
                f"string. Received: texts={texts!r}"
            )
        if max_length is not None:
            positive_integer("Vocabulary.encode", "max_length", max_length)
        unk = self.index[self.UNK]
        rows = []
        for text in texts:
            ids = [self.index.get(t, unk) for t in self.split(text)]
            if add_start:
                ids = [self.start_id, *ids]
            if max_length is not None and len(ids) + add_end > max_length:
                ids = ids[: max_length - add_end]
            if add_end:
                ids = [*ids, self.end_id]
            rows.append(ids)
        length = max_length or max((len(r) for r in rows), default=0)
        out = np.zeros((len(rows), length), "int32")
        for i, ids in enumerate(rows):
            out[i, : len(ids)] = ids
        return out

    def decode(self, ids) -> str:
        """Text of an id sequence, stopping at `<end>`, skipping specials.

        Word tokens are joined by spaces, so `decode` gives a text's
        tokens, not its spacing: compare it with `tokenized(text)`.
        """
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise ValueError(
                "Vocabulary.decode: `ids` must be one sequence of integer "
                f"ids. Received: ids.shape={ids.shape}, ids.dtype={ids.dtype}"
            )
        if ids.size and (ids.min() < 0 or ids.max() >= len(self.tokens)):
            raise ValueError(
                f"Vocabulary.decode: `ids` must be in [0, {len(self.tokens)})"
                f". Received: ids in [{ids.min()}, {ids.max()}]"
            )
        out = []
        for i in ids.tolist():
            if i == self.end_id:
                break
            if i >= 4:
                out.append(self.tokens[i])
        return self._join(out)

    def tokenized(self, text: str) -> str:
        """`text` as `decode` writes a text: its tokens, joined by spaces
        for word tokens (unknown tokens kept). Score decoded translations
        against `tokenized(reference)`.

        Examples:
            >>> vocab = Vocabulary(["Salut"])
            >>> vocab.tokenized("C'est moi.")
            "C ' est moi ."
        """
        return self._join(self.split(text))

    def _join(self, tokens) -> str:
        return ("" if self.tokenizer == "char" else " ").join(tokens)

    def get_config(self):
        return {"tokens": self.tokens[4:], "tokenizer": self.tokenizer}
