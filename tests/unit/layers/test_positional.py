"""PositionalEncoding, PositionEmbedding and RotaryEmbedding."""

import keras
import numpy as np
import pytest

from keras_attention import PositionalEncoding
from keras_attention import PositionEmbedding
from keras_attention import RotaryEmbedding
from tests.helpers import np_rotary
from tests.helpers import rng
from tests.helpers import to_numpy


def formula(length, dim, start=0, wavelength=10000.0):
    """PE[p, 2i] = sin(p / m^(2i/D)), PE[p, 2i+1] = cos(p / m^(2i/D))."""
    pe = np.zeros((length, dim))
    for p in range(start, start + length):
        for j in range(dim):
            angle = p / wavelength ** (2 * (j // 2) / dim)
            pe[p - start, j] = np.sin(angle) if j % 2 == 0 else np.cos(angle)
    return pe


@pytest.mark.parametrize("dim", [8, 7])
@pytest.mark.parametrize("start", [0, 5])
def test_sinusoidal_encoding_equals_the_formula(start, dim):
    x = rng().normal(size=(2, 6, dim)).astype("float32")
    out = PositionalEncoding()(x, start_index=start)
    np.testing.assert_allclose(
        to_numpy(out), x + formula(6, dim, start), atol=1e-5
    )


def test_sinusoidal_encoding_golden_values():
    # p = 1, D = 4: sin(1), cos(1), sin(1/100), cos(1/100).
    out = to_numpy(PositionalEncoding()(np.zeros((1, 2, 4), "float32")))
    np.testing.assert_allclose(
        out[0, 1], [0.841471, 0.540302, 0.0099998, 0.99995], atol=1e-5
    )


def test_encoding_start_index_continues_the_sequence():
    x = rng().normal(size=(1, 9, 6)).astype("float32")
    layer = PositionalEncoding(max_wavelength=50.0)
    whole = to_numpy(layer(x))
    tail = to_numpy(layer(x[:, 4:], start_index=4))
    np.testing.assert_allclose(tail, whole[:, 4:], atol=1e-5)


def test_position_embedding_adds_rows_of_its_table():
    x = rng().normal(size=(2, 4, 6)).astype("float32")
    layer = PositionEmbedding(max_length=10)
    out = to_numpy(layer(x, start_index=3))
    table = to_numpy(layer.embeddings)
    np.testing.assert_allclose(out, x + table[3:7], atol=1e-6)


def test_position_embedding_length_limit():
    layer = PositionEmbedding(max_length=4)
    with pytest.raises(ValueError, match="start_index=2"):
        layer(np.zeros((1, 3, 2), "float32"), start_index=2)
    with pytest.raises(ValueError, match="max_length=0"):
        PositionEmbedding(max_length=0)


@pytest.mark.parametrize("rank", [3, 4])
def test_rotary_matches_numpy(rank):
    shape = (2, 5, 8) if rank == 3 else (2, 5, 3, 8)
    x = rng().normal(size=shape).astype("float32")
    out = RotaryEmbedding()(x, start_index=2)
    np.testing.assert_allclose(to_numpy(out), np_rotary(x, 2), atol=1e-5)


def test_rotary_products_depend_only_on_relative_position():
    g = rng(4)
    q = g.normal(size=(1, 1, 8)).astype("float32")
    k = g.normal(size=(1, 1, 8)).astype("float32")
    rope = RotaryEmbedding(max_wavelength=100.0)

    def product(p, r):
        rq = to_numpy(rope(q, start_index=p))
        rk = to_numpy(rope(k, start_index=r))
        return float((rq * rk).sum())

    assert product(7, 4) == pytest.approx(product(3, 0), abs=1e-4)
    assert product(12, 2) == pytest.approx(product(10, 0), abs=1e-4)
    assert product(3, 0) != pytest.approx(product(4, 0), abs=1e-3)
    # Rotations keep norms.
    np.testing.assert_allclose(
        np.linalg.norm(to_numpy(rope(q, start_index=9))),
        np.linalg.norm(q),
        rtol=1e-5,
    )


def test_rotary_parity_with_keras_hub():
    keras_hub = pytest.importorskip("keras_hub")
    x = rng().normal(size=(2, 6, 4, 8)).astype("float32")
    ours = RotaryEmbedding()(x, start_index=3)
    theirs = keras_hub.layers.RotaryEmbedding()(x, start_index=3)
    np.testing.assert_allclose(to_numpy(ours), to_numpy(theirs), atol=1e-5)


def test_rotary_rejects_odd_dims():
    with pytest.raises(ValueError, match=r"inputs.shape=\(1, 2, 5\)"):
        RotaryEmbedding()(np.zeros((1, 2, 5), "float32"))


@pytest.mark.parametrize(
    "make",
    [
        lambda: PositionalEncoding(),
        lambda: PositionEmbedding(max_length=8),
    ],
)
def test_masks_pass_through_and_models_save(make, tmp_path):
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(9, 6, mask_zero=True)(tokens)
    x = make()(x)
    pooled = keras.layers.GlobalAveragePooling1D()(x)
    model = keras.Model(tokens, pooled)
    ids = np.array([[3, 4, 0, 0], [1, 2, 3, 4]])
    out = to_numpy(model(ids))
    full = to_numpy(keras.Model(tokens, x)(ids))
    np.testing.assert_allclose(out[0], full[0, :2].mean(0), atol=1e-5)
    path = tmp_path / "model.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    np.testing.assert_allclose(to_numpy(restored(ids)), out, atol=1e-6)
