"""Decoding: greedy search, beam search with GNMT penalties, sampling.

All three drive a step function, so they serve an RNN `AttentionDecoder`
and a Transformer decoder with a KV cache alike:

    step_fn(token_ids, state) -> (logits, new_state)
    step_fn(token_ids, state) -> (logits, new_state, attention)

`token_ids` is `(B,)` (the previous tokens), `logits` `(B, V)` unnormalised
scores of the next token, `attention` `(B, S)` the step's alignment over
the source (only needed by `coverage_penalty`), and `state` any nested
structure of tensors whose leading axis is the batch. Everything that is
per example (decoder states, KV caches, encoder outputs and their masks)
belongs in `state`; what all examples share (an embedding table, a
weight) belongs in the step function's closure. Beam search tiles every
state leaf that has a leading axis to `B·K` rows and reorders it after
every step, so such a leaf must have `B` rows (a `ValueError` names the
one that does not); leaves without a leading axis (Python numbers, scalar
tensors such as a cache position) are shared by all rows and passed
through. Greedy search and sampling hand the state to the step function
as it is.

Shape legend: B batch, K beams, V vocabulary, L generated length, S source.
"""

from keras_attention.decoding._compiled import (
    clear_compiled_programs as clear_compiled_programs,
)
from keras_attention.decoding.beam import beam_search as beam_search
from keras_attention.decoding.greedy import greedy_search as greedy_search
from keras_attention.decoding.greedy import sample as sample

# In the order the API reference lists them.
__all__ = ["greedy_search", "sample", "beam_search", "clear_compiled_programs"]

# Their public path: documented, doctested and pickled as
# `keras_attention.decoding.<name>`, where they have always been.
for _function in (beam_search, clear_compiled_programs, greedy_search, sample):
    _function.__module__ = __name__
del _function
