"""`Model.quantize` on models built from every public layer.

Every `Dense` / `EinsumDense` projection inside our layers is quantized;
raw weights (Bahdanau's score vector, the location convolution, RNN cell
kernels, position embeddings) are not quantizable and stay float.
"""

import warnings

import keras
import numpy as np
import pytest

import keras_attention as ka
from tests.helpers import to_numpy

pytestmark = pytest.mark.slow  # runs early: see tests/conftest.py

B, T, S, D, N = 2, 5, 4, 8, 2

# Error bound: max |quantized - float32| / max |float32| over the outputs.
# int8 keeps 8 bits per kernel column and per token of the activations, a
# relative error of ~2^-7 per projection (0.2-0.4% measured for one
# projection). Through the ~20 projections in series of this random,
# untrained model the errors compound: 1.6% on PyTorch, 1.8% on JAX and
# 4.9% on TensorFlow, whose seed draws other weights (quantizing the
# encoder block alone gives 0.5% at its output on TensorFlow and JAX, 4.6%
# at the model's on TensorFlow). 8% leaves a margin and still catches a
# broken conversion, whose error is of the order of the outputs. Keras's
# float8 is FP8 training with delayed scaling: its scales start at 1 and
# are only calibrated by training steps, so uncalibrated inference is
# coarse (measured 11-37%): the bound only catches a broken conversion.
TOLERANCE = {"int8": 0.08, "float8": 0.5}


def _is_projection(layer):
    return type(layer) in (keras.layers.Dense, keras.layers.EinsumDense)


def _only_projections(layer):
    return _is_projection(layer)


def build_model():
    """A model through every public layer (rotary never called eagerly)."""
    keras.utils.set_random_seed(0)
    x_in = keras.Input((T, D), name="x")
    enc_in = keras.Input((S, D), name="enc")
    x = ka.PositionalEncoding()(x_in)
    x = ka.PositionEmbedding(T)(x)
    x = ka.MultiHeadSelfAttention(N, use_rotary=True, name="mhsa")(x)
    enc = ka.TransformerEncoderBlock(N, 16, name="encoder")(enc_in)
    x = ka.CrossAttention(N, name="cross")(x, enc)
    x = ka.TransformerDecoderBlock(N, 16, name="decoder")(
        x, encoder_outputs=enc
    )
    x = x + ka.BahdanauAttention(D, name="bahdanau")(x, enc)
    x = x + ka.LuongAttention("concat", units=D, name="luong")(x, enc)
    x = x + ka.LocationSensitiveAttention(
        D, filters=2, kernel_size=3, name="location"
    )(x, enc)
    x = x + ka.MonotonicAttention(D, name="monotonic")(x, enc)
    x = ka.AttentionDecoder(
        keras.layers.GRUCell(D),
        ka.LuongAttention("general"),
        name="rnn_decoder",
    )(x, enc)
    return keras.Model([x_in, enc_in], x)


def inputs():
    rng = np.random.default_rng(0)
    return [
        rng.normal(size=(B, T, D)).astype("float32"),
        rng.normal(size=(B, S, D)).astype("float32"),
    ]


def projections(model):
    return [layer for layer in model._flatten_layers() if _is_projection(layer)]


@pytest.fixture(scope="module")
def float_model():
    model = build_model()
    return model, to_numpy(model(inputs()))


@pytest.fixture(scope="module", params=["int8", "float8"])
def quantized(request, float_model):
    mode = request.param
    model = build_model()
    model.set_weights(float_model[0].get_weights())
    model.quantize(mode, filters=_only_projections)
    return mode, model


def test_every_projection_is_quantized(quantized):
    mode, model = quantized
    layers = projections(model)
    # 4 per attention core x 5 cores, 2 feed-forward x 2 blocks, 2 each
    # for Bahdanau, Luong concat and the monotonic scorer, 3 for location,
    # Luong general's key and the RNN decoder's output projection.
    assert len(layers) == 35
    unquantized = [
        layer.path for layer in layers if layer.quantization_mode != mode
    ]
    assert unquantized == []


def test_quantized_outputs_are_close(quantized, float_model):
    mode, model = quantized
    reference = float_model[1]
    outputs = to_numpy(model(inputs()))
    error = np.max(np.abs(outputs - reference)) / np.max(np.abs(reference))
    print(f"{mode}: max abs error / max abs output = {error:.4f}")
    assert 0 < error < TOLERANCE[mode], error


@pytest.mark.parametrize("quantized", ["int8", "float8"], indirect=True)
def test_quantized_save_load(quantized, tmp_path):
    mode, model = quantized
    expected = to_numpy(model(inputs()))
    path = tmp_path / "model.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    assert [layer.quantization_mode for layer in projections(restored)] == [
        mode
    ] * 35
    np.testing.assert_array_equal(to_numpy(restored(inputs())), expected)
    # Saved again from the restored model: the scales survive.
    restored.save(tmp_path / "again.keras")
    again = keras.saving.load_model(tmp_path / "again.keras")
    np.testing.assert_array_equal(to_numpy(again(inputs())), expected)


def test_quantized_decoding_step_matches_full():
    """The cached path calls the projections through the inference
    shortcut; quantized, it still equals the full causal computation."""
    keras.utils.set_random_seed(1)
    block = ka.TransformerDecoderBlock(N, 16, use_rotary=True)
    x = np.random.default_rng(1).normal(size=(B, T, D)).astype("float32")
    model = keras.Sequential([keras.Input((T, D)), block])
    model.quantize("int8", filters=_only_projections)
    full = to_numpy(block(x))
    cache = np.zeros((B, 2, T, N, D // N), "float32")
    steps = []
    for i in range(T):
        out, cache = block(x[:, i : i + 1], cache=cache, cache_index=i)
        steps.append(to_numpy(out))
    np.testing.assert_allclose(
        np.concatenate(steps, axis=1), full, rtol=1e-5, atol=1e-5
    )


def test_quantize_warns_only_about_raw_leaves():
    """Without `filters`, Keras warns for each leaf it cannot quantize;
    our projections are quantized either way."""
    model = keras.Sequential(
        [keras.Input((T, D)), ka.TransformerEncoderBlock(N, 16)]
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.quantize("int8")
    warned = {
        str(w.message).split()[1]
        for w in caught
        if issubclass(w.category, UserWarning)
    }
    assert warned == {"InputLayer", "LayerNormalization", "Dropout"}
    assert [layer.quantization_mode for layer in projections(model)] == [
        "int8"
    ] * 6
