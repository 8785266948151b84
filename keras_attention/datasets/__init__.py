"""Small real-language parallel corpora made offline, a TSV loader, and a
synthetic task with known alignments."""

from keras_attention.datasets.alignment import AlignedPair as AlignedPair
from keras_attention.datasets.alignment import (
    alignment_error_rate as alignment_error_rate,
)
from keras_attention.datasets.alignment import (
    load_spelled_digits as load_spelled_digits,
)
from keras_attention.datasets.builtin import load_dates as load_dates
from keras_attention.datasets.builtin import load_numbers as load_numbers
from keras_attention.datasets.builtin import load_tsv as load_tsv
from keras_attention.datasets.parallel_corpus import (
    ParallelCorpus as ParallelCorpus,
)
from keras_attention.datasets.vocabulary import Vocabulary as Vocabulary
from keras_attention.datasets.vocabulary import char_tokens as char_tokens
from keras_attention.datasets.vocabulary import word_tokens as word_tokens
