"""`sublayers.call_leaf`: a built leaf sublayer called straight through
`call` in inference gives what `__call__` gives; `__call__` is kept where
it matters.
"""

import keras
import numpy as np
import pytest

import keras_attention as ka
from keras_attention.layers.sublayers import call_leaf
from tests.helpers import rng
from tests.helpers import to_numpy


def run_both_ways(layer, *args, **kwargs):
    """Inference (sublayers through `call`) and `training=True` without
    dropout (sublayers through `__call__`)."""
    fast = layer(*args, training=False, **kwargs)
    full = layer(*args, training=True, **kwargs)
    return fast, full


def x(shape, seed=0):
    return rng(seed).normal(size=shape).astype("float32")


CASES = {
    "self_attention": lambda: run_both_ways(
        ka.MultiHeadSelfAttention(4, num_key_value_heads=2, use_rotary=True),
        x((2, 5, 16)),
        padding_mask=np.array([[1, 1, 1, 0, 0], [1] * 5], bool),
        use_causal_mask=True,
    ),
    "cross_attention": lambda: run_both_ways(
        ka.CrossAttention(2), x((2, 3, 16)), x((2, 6, 16), 1)
    ),
    "encoder_block": lambda: run_both_ways(
        ka.TransformerEncoderBlock(2, 32, normalize_first=True), x((2, 5, 16))
    ),
    "decoder_block": lambda: run_both_ways(
        ka.TransformerDecoderBlock(2, 32), x((2, 4, 16)), x((2, 6, 16), 1)
    ),
    "bahdanau": lambda: run_both_ways(
        ka.BahdanauAttention(8, normalize=True), x((2, 3, 16)), x((2, 6, 16))
    ),
    "luong_concat": lambda: run_both_ways(
        ka.LuongAttention("concat", units=8), x((2, 3, 16)), x((2, 6, 16))
    ),
    "attention_decoder": lambda: run_both_ways(
        ka.AttentionDecoder(
            keras.layers.GRUCell(16), ka.LuongAttention("general")
        ),
        x((2, 4, 8)),
        x((2, 6, 16), 1),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_inference_path_equals_call_path(name):
    keras.utils.set_random_seed(0)
    fast, full = CASES[name]()
    pairs = zip(keras.tree.flatten(fast), keras.tree.flatten(full), strict=True)
    for a, b in pairs:
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), atol=1e-6)


def test_cached_decoding_step_equals_call_path():
    keras.utils.set_random_seed(1)
    block = ka.TransformerDecoderBlock(2, 32, use_rotary=True)
    inputs = x((2, 3, 16))
    block(inputs)
    cache = block.init_cache(2, 5)
    fast, fast_cache = block(inputs, cache=cache, cache_index=1)
    full, full_cache = block(inputs, cache=cache, cache_index=1, training=True)
    np.testing.assert_allclose(to_numpy(fast), to_numpy(full), atol=1e-6)
    np.testing.assert_allclose(
        to_numpy(fast_cache["self"]), to_numpy(full_cache["self"]), atol=1e-6
    )


def test_containers_are_refused():
    with pytest.raises(TypeError, match="Received: MultiHeadSelfAttention"):
        call_leaf(ka.MultiHeadSelfAttention(2), np.ones((1, 2, 4), "float32"))


def test_dropout_is_skipped_in_inference_only():
    dropout = keras.layers.Dropout(0.5, seed=1)
    ones = keras.ops.ones((4, 100))
    assert call_leaf(dropout, ones) is ones
    dropped = to_numpy(call_leaf(dropout, ones, training=True))
    assert 0.3 < np.mean(dropped == 0) < 0.7


def test_unbuilt_and_mixed_precision_layers_use_call():
    dense = keras.layers.Dense(3)
    out = call_leaf(dense, np.ones((2, 4), "float32"))  # builds it
    assert dense.built and tuple(out.shape) == (2, 3)
    mixed = keras.layers.Dense(3, dtype="mixed_float16")
    mixed.build((None, 4))
    out = call_leaf(mixed, np.ones((2, 4), "float32"))
    # Only `__call__` autocasts the inputs and kernel to float16.
    assert keras.backend.standardize_dtype(out.dtype) == "float16"


def test_public_methods_take_numpy_float64():
    """Methods called outside `__call__` get NumPy inputs converted."""
    keras.utils.set_random_seed(2)
    layer = ka.CrossAttention(2)
    query, source = x((2, 3, 16)), x((2, 6, 16), 1)
    expected = layer(query, source)
    cache = layer.compute_cache(source.astype("float64"))
    assert keras.backend.standardize_dtype(cache.dtype) == "float32"
    np.testing.assert_allclose(
        to_numpy(layer(query, None, cache=cache)), to_numpy(expected), atol=1e-6
    )
    bahdanau = ka.BahdanauAttention(8)
    bahdanau(query, source)
    keys = bahdanau.project_keys(source.astype("float64"))
    assert keras.backend.standardize_dtype(keys.dtype) == "float32"


def test_dropout_layers_are_the_identity_in_inference():
    keras.utils.set_random_seed(3)
    inputs = x((2, 5, 16))
    with_dropout = ka.TransformerEncoderBlock(2, 32, dropout=0.4)
    without = ka.TransformerEncoderBlock(2, 32)
    with_dropout(inputs)
    without(inputs)
    without.set_weights(with_dropout.get_weights())
    np.testing.assert_allclose(
        to_numpy(with_dropout(inputs)), to_numpy(without(inputs)), atol=1e-6
    )
    trained = to_numpy(with_dropout(inputs, training=True))
    assert not np.allclose(trained, to_numpy(without(inputs)), atol=1e-3)


def test_attention_dropout_of_an_attention_decoder_acts_in_training():
    keras.utils.set_random_seed(4)
    layer = ka.AttentionDecoder(
        keras.layers.GRUCell(16), ka.BahdanauAttention(8, dropout=0.5)
    )
    inputs, source = x((2, 4, 8)), x((2, 6, 16), 1)
    inference = to_numpy(layer(inputs, source))
    np.testing.assert_allclose(to_numpy(layer(inputs, source)), inference)
    trained = to_numpy(layer(inputs, source, training=True))
    assert not np.allclose(trained, inference, atol=1e-4)
