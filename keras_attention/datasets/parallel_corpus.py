"""A parallel corpus with deterministic train/validation/test splits."""

import dataclasses
import random


@dataclasses.dataclass(frozen=True)
class ParallelCorpus:
    """Source/target sentence pairs split into train, validation and test.

    No source sentence appears in two splits, so test scores measure
    generalisation, not memory.

    Attributes:
        name (str): What the corpus is.
        train (list[tuple[str, str]]): `(source, target)` string pairs.
        validation (list[tuple[str, str]]): `(source, target)` pairs.
        test (list[tuple[str, str]]): `(source, target)` pairs.

    Examples:
        >>> corpus = ParallelCorpus.from_pairs(
        ...     "toy", [(str(i), str(i * 2)) for i in range(10)], seed=0
        ... )
        >>> len(corpus.train), len(corpus.validation), len(corpus.test)
        (8, 1, 1)
    """

    name: str
    train: list
    validation: list
    test: list

    @classmethod
    def from_pairs(
        cls, name: str, pairs, seed: int = 0, fractions=(0.8, 0.1, 0.1)
    ) -> "ParallelCorpus":
        """Deduplicates sources, shuffles with `seed` and splits.

        Args:
            name: The corpus name.
            pairs (Iterable[tuple[str, str]]): `(source, target)` strings.
                For a repeated source the first pair is kept.
            seed: Shuffling seed; the same seed gives the same splits.
            fractions (tuple[float, float, float]): `(train, validation,
                test)` fractions in [0, 1] summing to 1.

        Returns:
            A `ParallelCorpus`.
        """
        if (
            len(fractions) != 3
            or not all(0.0 <= f <= 1.0 for f in fractions)
            or abs(sum(fractions) - 1.0) > 1e-6
        ):
            raise ValueError(
                "ParallelCorpus: `fractions` must be three numbers in [0, 1] "
                f"summing to 1. Received: fractions={fractions}"
            )
        unique = {}
        for source, target in pairs:
            unique.setdefault(source, target)
        items = sorted(unique.items())
        random.Random(seed).shuffle(items)
        n_train = int(round(fractions[0] * len(items)))
        n_valid = int(round(fractions[1] * len(items)))
        return cls(
            name=name,
            train=items[:n_train],
            validation=items[n_train : n_train + n_valid],
            test=items[n_train + n_valid :],
        )

    def filter(self, max_source_length=None, tokenize=str.split):
        """Keeps the pairs whose source has at most `max_source_length`
        tokens (as counted by `tokenize`)."""
        if max_source_length is None:
            return self

        def keep(split):
            return [
                (s, t)
                for s, t in split
                if len(tokenize(s)) <= max_source_length
            ]

        return dataclasses.replace(
            self,
            train=keep(self.train),
            validation=keep(self.validation),
            test=keep(self.test),
        )
