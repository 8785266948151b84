"""Whole-model training: mixed precision stays finite, seeds reproduce.

The model is tests/integration/checkpoint_worker.py's, which uses every
public layer.
"""

import keras
import numpy as np
import pytest

import keras_attention as ka
from tests.helpers import to_numpy
from tests.integration.checkpoint_worker import VOCAB
from tests.integration.checkpoint_worker import build_model

pytestmark = pytest.mark.slow  # runs early: see tests/conftest.py


def batches(seed=0, size=16):
    """Padded source/target batches and next-token labels."""
    rng = np.random.default_rng(seed)
    source = rng.integers(1, VOCAB, (size, 9))
    target = rng.integers(1, VOCAB, (size, 6))
    for row in range(size):  # every row padded to its own length
        source[row, rng.integers(2, 10) :] = 0
        target[row, rng.integers(2, 7) :] = 0
    labels = np.roll(target, -1, axis=1)
    labels[:, -1] = 0
    return [source, target], labels


def compile_model(model, learning_rate=1e-2):
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, ignore_class=0
        ),
    )
    return model


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_training_stays_finite(policy):
    keras.config.set_dtype_policy(policy)
    model = compile_model(build_model())
    # Large embeddings make attention logits far beyond float16's range
    # (65504) if they were computed in half precision.
    for layer in model.layers:
        if isinstance(layer, keras.layers.Embedding):
            layer.embeddings.assign(layer.embeddings * 300.0)
    inputs, labels = batches()
    embedded = model.get_layer("positions")(model.get_layer("embed")(inputs[0]))
    _, scores = model.get_layer("encoder")(
        embedded, padding_mask=inputs[0] != 0, return_attention_scores=True
    )
    assert np.all(np.isfinite(to_numpy(scores)))
    assert np.max(to_numpy(scores)) > 0.99  # the logits are that large
    history = model.fit(inputs, labels, epochs=4, batch_size=8, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0], losses
    for weight in model.weights:
        assert np.all(np.isfinite(to_numpy(weight))), weight.path
    outputs = to_numpy(model(inputs))
    assert np.all(np.isfinite(outputs))


def dropout_model():
    """Dropout in every place the layers offer it."""
    source = keras.Input((None,), dtype="int32")
    target = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, 8, mask_zero=True)(source)
    x = ka.TransformerEncoderBlock(2, 16, dropout=0.3)(x)
    y = keras.layers.Embedding(VOCAB, 8, mask_zero=True)(target)
    y = keras.layers.Dropout(0.3)(y)
    t = ka.TransformerDecoderBlock(2, 16, dropout=0.3)(y, x)
    t = ka.CrossAttention(2, dropout=0.3)(t, x)
    r = ka.AttentionDecoder(keras.layers.GRUCell(8), ka.BahdanauAttention(6))(
        y, x
    )
    m = ka.AttentionDecoder(
        keras.layers.GRUCell(8),
        ka.MonotonicAttention(6, sigmoid_noise=1.0, dropout=0.3),
    )(y, x)
    logits = keras.layers.Dense(VOCAB)(keras.layers.Concatenate()([t, r, m]))
    return keras.Model([source, target], logits)


def train(seed):
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    model = compile_model(dropout_model(), learning_rate=3e-3)
    inputs, labels = batches(seed=5)
    history = model.fit(
        inputs, labels, epochs=2, batch_size=4, shuffle=True, verbose=0
    )
    dropped = to_numpy(model(inputs, training=True))
    weights = [to_numpy(w) for w in model.weights]
    return history.history["loss"], dropped, weights


def test_training_with_dropout_is_reproducible():
    losses, dropped, weights = train(seed=11)
    again_losses, again_dropped, again_weights = train(seed=11)
    np.testing.assert_array_equal(again_losses, losses)
    np.testing.assert_array_equal(again_dropped, dropped)
    for a, b in zip(again_weights, weights, strict=True):
        np.testing.assert_array_equal(a, b)
    other_losses, other_dropped, _ = train(seed=12)
    assert not np.array_equal(other_losses, losses)
    assert not np.allclose(other_dropped, dropped)


def test_dropout_masks_repeat_with_the_seed():
    """Layers draw their dropout seeds when built, as Keras layers do: the
    same global seed before building gives the same sequence of masks."""
    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")

    def run(seed):
        keras.utils.set_random_seed(seed)
        layer = ka.MultiHeadSelfAttention(2, dropout=0.5)
        calls = [to_numpy(layer(x, training=True)) for _ in range(2)]
        return calls, to_numpy(layer(x))

    (first, second), inference = run(3)
    (again_first, again_second), _ = run(3)
    np.testing.assert_array_equal(again_first, first)
    np.testing.assert_array_equal(again_second, second)
    assert not np.allclose(first, second)  # a new mask on every call
    assert not np.allclose(first, inference)
