"""Greedy search: by hand, with an end id, over an RNN decoder and a cached
Transformer."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention import AttentionDecoder
from keras_attention import LuongAttention
from keras_attention import TransformerDecoderBlock
from keras_attention.decoding import beam_search
from keras_attention.decoding import greedy_search
from keras_attention.decoding import sample
from tests.helpers import rng
from tests.helpers import to_numpy
from tests.unit.decoding.step_functions import L
from tests.unit.decoding.step_functions import PrefixModel
from tests.unit.decoding.step_functions import V


def test_greedy_search_by_hand():
    model = PrefixModel(5)
    got = to_numpy(greedy_search(model.step, model.initial_state(1), [2], L))
    code, token, want = 0, 2, []
    for _ in range(L):
        code = code * V + token + 1
        token = int(np.argmax(model.logits[code]))
        want.append(token)
    np.testing.assert_array_equal(got[0], want)


def test_positions_after_end_hold_end_id():
    # Always predicts ids + 1: from 0 the sequence is 1, 2, 3(end), 3, ...
    table = ops.convert_to_tensor(np.eye(5, k=1, dtype="float32") * 5)

    def step(ids, state):
        return ops.take(table, ids, axis=0), state

    for decode in (greedy_search, lambda *a, **k: sample(*a, **k, top_k=1)):
        ids = to_numpy(decode(step, (), np.array([0, 2]), 6, end_id=3))
        np.testing.assert_array_equal(
            ids, [[1, 2, 3, 3, 3, 3], [3, 3, 3, 3, 3, 3]]
        )
    beams, _ = beam_search(step, (), np.array([0, 2]), 6, 2, end_id=3)
    np.testing.assert_array_equal(
        to_numpy(beams), [[1, 2, 3, 3, 3, 3], [3, 3, 3, 3, 3, 3]]
    )


def test_decoding_an_attention_decoder():
    g = rng(8)
    embedding = keras.layers.Embedding(6, 4)
    layer = AttentionDecoder(keras.layers.GRUCell(8), LuongAttention("dot"))
    output = keras.layers.Dense(6)
    encoded = g.normal(size=(2, 5, 8)).astype("float32")
    mask = np.array([[1, 1, 1, 0, 0], [1] * 5], bool)
    layer(embedding(np.zeros((2, 1), "int32")), encoded)

    def step(ids, state):
        # Encoder outputs and masks travel in the state, so that beam search
        # tiles and reorders them with the decoder state.
        out, decoder_state, alignment = layer.step(
            embedding(ids), state["decoder"], state["encoded"], state["mask"]
        )
        return output(out), {**state, "decoder": decoder_state}, alignment

    state = {
        "decoder": layer.get_initial_state(encoded, mask),
        "encoded": encoded,
        "mask": mask,
    }
    greedy = to_numpy(greedy_search(step, state, np.array([1, 1]), 4))
    # Teacher-forcing the greedy output reproduces its argmaxes.
    inputs = np.concatenate([[[1], [1]], greedy[:, :-1]], axis=1)
    logits = output(
        layer(embedding(inputs), encoded, encoder_padding_mask=mask)
    )
    np.testing.assert_array_equal(np.argmax(to_numpy(logits), -1), greedy)
    beams, _ = beam_search(
        step, state, np.array([1, 1]), 4, beam_width=3, coverage_penalty=0.2
    )
    assert tuple(beams.shape) == (2, 4)


def test_cached_transformer_greedy_equals_uncached():
    g = rng(9)
    embedding = keras.layers.Embedding(7, 16)
    block = TransformerDecoderBlock(2, 32, use_rotary=True)
    head = keras.layers.Dense(7)
    source = g.normal(size=(2, 5, 16)).astype("float32")
    block(embedding(np.zeros((2, 1), "int32")), source)
    steps = 5

    def cached_step(ids, state):
        hidden, cache = block(
            embedding(ids[:, None]),
            cache=state["cache"],
            cache_index=state["index"],
        )
        return head(hidden[:, 0]), {"cache": cache, "index": state["index"] + 1}

    def uncached_step(ids, state):
        prefix = ops.concatenate([state, ids[:, None]], axis=1)
        hidden = block(embedding(prefix), source)
        return head(hidden[:, -1]), prefix

    cache = block.init_cache(2, steps, encoder_outputs=source)
    start = np.array([1, 2], "int32")
    cached = greedy_search(
        cached_step, {"cache": cache, "index": 0}, start, steps
    )
    uncached = greedy_search(
        uncached_step, np.zeros((2, 0), "int32"), start, steps
    )
    np.testing.assert_array_equal(to_numpy(cached), to_numpy(uncached))


def test_a_step_function_returning_one_value_is_refused():
    model = PrefixModel()
    with pytest.raises(ValueError, match="Received:"):
        greedy_search(
            lambda i, x: ops.zeros((1, 3)), model.initial_state(1), [0], 2
        )
