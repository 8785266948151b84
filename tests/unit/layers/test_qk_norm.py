"""QK normalisation (`use_qk_norm`): each head's queries and keys are
RMS-normalised over the head dim with a learned scale before rotary
positions and the dot product. Checked against NumPy, through a saved
model and in both blocks; every path and gradient of a layer with it is
in the path harness (`test_paths_layers.py`)."""

import keras
import numpy as np
import pytest

import keras_attention as ka
from tests.helpers import np_rotary
from tests.helpers import np_sdpa
from tests.helpers import rng
from tests.helpers import to_numpy

B, T, D = 2, 5, 16


def _np_rms(x, scale, epsilon=1e-6):
    x = np.asarray(x, "float64")
    return x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + epsilon) * scale


def _randomized(layer, seed):
    """Random values in every weight, the norm scales included (all ones
    would hide a scale that is not applied)."""
    generator = rng(seed)
    layer.set_weights(
        [
            generator.normal(size=w.shape).astype("float32")
            for w in layer.weights
        ]
    )


@pytest.mark.parametrize("use_rotary", [False, True])
def test_qk_norm_equals_the_numpy_reference(use_rotary):
    layer = ka.MultiHeadSelfAttention(
        num_heads=4,
        key_dim=4,
        num_key_value_heads=2,
        use_qk_norm=True,
        use_rotary=use_rotary,
    )
    x = rng(0).normal(size=(B, T, D)).astype("float32")
    layer(x)
    _randomized(layer, 1)
    assert tuple(layer.query_norm.scale.shape) == (4,)
    w = {v.path.split("/", 1)[1]: to_numpy(v) for v in layer.weights}
    q = np.einsum("btd,dnh->btnh", x, w["query_dense/kernel"])
    k = np.einsum("btd,dnh->btnh", x, w["key_dense/kernel"])
    v = np.einsum("btd,dnh->btnh", x, w["value_dense/kernel"])
    q, k, v = (
        q + w["query_dense/bias"],
        k + w["key_dense/bias"],
        v + w["value_dense/bias"],
    )
    q = _np_rms(q, w["query_norm/scale"])
    k = _np_rms(k, w["key_norm/scale"])
    if use_rotary:
        q, k = np_rotary(q), np_rotary(k)
    heads, _ = np_sdpa(q, k, v, causal=True)
    expected = np.einsum("btnv,nvd->btd", heads, w["output_dense/kernel"])
    expected += w["output_dense/bias"]
    got = to_numpy(layer(x, use_causal_mask=True))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_qk_norm_in_both_blocks_survives_saving(tmp_path):
    """The decoder block normalises its cross-attention too; a saved model
    keeps the argument and the scales."""
    target = keras.Input((T, D))
    source = keras.Input((3, D))
    encoded = ka.TransformerEncoderBlock(2, 8, use_qk_norm=True)(source)
    decoder = ka.TransformerDecoderBlock(2, 8, use_qk_norm=True)
    model = keras.Model([target, source], decoder(target, encoded))
    assert decoder.cross_attention.use_qk_norm
    norms = [w for w in model.weights if "_norm/scale" in w.path]
    assert len(norms) == 6  # query and key, three attention layers
    for norm in norms:
        norm.assign(rng(2).normal(size=norm.shape).astype("float32"))
    inputs = [
        rng(3).normal(size=(B, T, D)).astype("float32"),
        rng(4).normal(size=(B, 3, D)).astype("float32"),
    ]
    path = str(tmp_path / "qk_norm.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(
        to_numpy(loaded(inputs)), to_numpy(model(inputs)), atol=1e-6
    )
