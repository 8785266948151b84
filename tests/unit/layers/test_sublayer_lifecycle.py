"""One sublayer lifecycle: sublayers are made and built in `build`, with
their (per-sublayer) dtype policies; arguments are checked at
construction; a user's cell is not changed; the decoder draws a training
loop's randomness through the mechanism's protocol (`draw_loop_noise`)."""

import keras
import numpy as np
import pytest

import keras_attention as ka
from tests.helpers import rng
from tests.helpers import to_numpy

B, T, S, D = 2, 3, 5, 8


def _sublayers(layer):
    return layer._flatten_layers(include_self=False)


@pytest.mark.parametrize(
    "make, shapes",
    [
        (lambda: ka.TransformerEncoderBlock(2, 16), [(B, T, D)]),
        (lambda: ka.TransformerDecoderBlock(2, 16), [(B, T, D), (B, S, D)]),
        (lambda: ka.MultiHeadSelfAttention(2, use_rotary=True), [(B, T, D)]),
        (lambda: ka.BahdanauAttention(4, dropout=0.1), [(B, D), (B, S, D)]),
        (
            lambda: ka.LocationSensitiveAttention(4, filters=2, kernel_size=3),
            [(B, D), (B, S, D)],
        ),
        (lambda: ka.MonotonicAttention(4), [(B, D), (B, S, D)]),
    ],
    ids=["encoder", "decoder", "self", "bahdanau", "location", "monotonic"],
)
def test_sublayers_are_made_in_build_with_the_layers_policy(make, shapes):
    layer = make()
    assert _sublayers(layer) == []  # nothing before `build`
    mixed = type(layer).from_config(
        {**layer.get_config(), "dtype": "mixed_bfloat16"}
    )
    mixed.build(*shapes)
    made = _sublayers(mixed)
    assert made and all(sub.built for sub in made)
    assert {sub.dtype_policy.name for sub in made} == {"mixed_bfloat16"}


def test_a_model_level_policy_map_reaches_a_containers_sublayers():
    """An absolute-path entry (as keras-hub writes) for a projection of
    the self-attention a block makes in `build`."""
    policy = keras.dtype_policies.DTypePolicyMap(
        "float32",
        {"block/self_attention/query_dense": keras.DTypePolicy("bfloat16")},
    )
    block = ka.TransformerEncoderBlock(2, 16, dtype=policy, name="block")
    block.build((B, T, D))
    attention = block.self_attention
    assert attention.query_dense.dtype_policy.name == "bfloat16"
    assert attention.key_dense.dtype_policy.name == "float32"
    assert block.feedforward_norm.dtype_policy.name == "float32"


def test_the_decoder_leaves_the_users_cell_as_it_was():
    cell = keras.layers.GRUCell(D)
    assert not cell.supports_masking
    decoder = ka.AttentionDecoder(
        cell, ka.LuongAttention(), input_feeding=False
    )
    embedding = keras.layers.Embedding(10, D, mask_zero=True)
    encoded = rng(0).normal(size=(B, S, D)).astype("float32")
    decoder(embedding(np.ones((B, T), "int32")), encoded, training=True)
    state = decoder.get_initial_state(encoded)
    # A masked step input through the cell's `__call__` (training), which
    # would warn (an error under pytest) if the mask reached it.
    decoder.step(embedding(np.array([3, 0])), state, encoded, training=True)
    assert decoder.cell is cell and not cell.supports_masking


class ZeroDropout(ka.BahdanauAttention):
    """Drops every weight in a training loop: the protocol decides."""

    def draw_loop_noise(self, shape):
        return {"dropout_mask": keras.ops.zeros(shape)}


def test_the_decoder_draws_loop_noise_through_the_mechanism():
    keras.utils.set_random_seed(0)
    decoder = ka.AttentionDecoder(
        keras.layers.GRUCell(D), ZeroDropout(4, dropout=0.5)
    )
    targets = rng(1).normal(size=(B, T, 4)).astype("float32")
    encoded = rng(2).normal(size=(B, S, D)).astype("float32")
    outputs = to_numpy(decoder(targets, encoded, training=True))
    # Every context is zero: as if the decoder saw a zero source.
    zero_source = to_numpy(decoder(targets, np.zeros_like(encoded)))
    np.testing.assert_allclose(outputs, zero_source, atol=1e-6)
    inference = to_numpy(decoder(targets, encoded))
    assert not np.allclose(outputs, inference, atol=1e-3)


@pytest.mark.parametrize(
    "make, keys",
    [
        (lambda: ka.BahdanauAttention(4), set()),
        (lambda: ka.BahdanauAttention(4, dropout=0.5), {"dropout_mask"}),
        (
            lambda: ka.MonotonicAttention(4, sigmoid_noise=1.0, dropout=0.5),
            {"dropout_mask", "score_noise"},
        ),
    ],
    ids=["none", "dropout", "monotonic"],
)
def test_draw_loop_noise_gives_attends_arguments(make, keys):
    layer = make()
    layer.build((B, D), (B, S, D))
    noise = layer.draw_loop_noise((T, B, S))
    assert set(noise) == keys
    assert all(tuple(v.shape) == (T, B, S) for v in noise.values())
    if "dropout_mask" in noise:  # a keep-mask scaled by 1 / (1 - 0.5)
        assert set(np.unique(to_numpy(noise["dropout_mask"]))) <= {0.0, 2.0}
