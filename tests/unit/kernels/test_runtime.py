"""`cache_index` and `start_index` given as NumPy scalars or tensors:
checked when their value is known, clipped (the same on every backend)
when traced inside a compiled function."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_attention as ka
from keras_attention._kernels import runtime
from tests.helpers import BACKEND
from tests.helpers import to_numpy

B, D, S_MAX = 1, 8, 4


def index_forms(value):
    """The same index as a Python int, NumPy scalars and a tensor."""
    return [
        value,
        np.int32(value),
        np.int64(value),
        np.array(value, "int32"),
        ops.convert_to_tensor(value, "int32"),
    ]


@pytest.fixture(scope="module")
def attention():
    layer = ka.MultiHeadSelfAttention(2)
    layer(np.zeros((B, 1, D), "float32"))
    return layer


@pytest.mark.parametrize("form", range(5))
@pytest.mark.parametrize("index", [4, 7, -1])
def test_known_cache_index_out_of_range_is_refused(attention, index, form):
    cache = np.zeros((B, 2, S_MAX, 2, D // 2), "float32")
    step = np.ones((B, 1, D), "float32")
    with pytest.raises(ValueError, match=f"cache_index={index}") as error:
        attention(step, cache=cache, cache_index=index_forms(index)[form])
    assert "MultiHeadSelfAttention" in str(error.value)
    assert "4 positions" in str(error.value)


@pytest.mark.parametrize("form", range(5))
def test_known_cache_index_in_range_writes_its_slot(attention, form):
    cache = np.zeros((B, 2, S_MAX, 2, D // 2), "float32")
    step = np.ones((B, 1, D), "float32")
    _, cache = attention(step, cache=cache, cache_index=index_forms(2)[form])
    written = np.abs(to_numpy(cache)).sum(axis=(0, 1, 3, 4))
    assert written[2] > 0 and written[[0, 1, 3]].sum() == 0


@pytest.mark.parametrize("form", range(5))
@pytest.mark.parametrize("start", [5, -1])
def test_known_start_index_out_of_range_is_refused(start, form):
    layer = ka.PositionEmbedding(6)
    with pytest.raises(ValueError, match=f"start_index={start}"):
        layer(
            np.zeros((B, 2, D), "float32"), start_index=index_forms(start)[form]
        )


@pytest.mark.parametrize("form", range(5))
def test_negative_start_index_is_refused_by_every_position_layer(form):
    x = np.zeros((B, 2, 4, D), "float32")
    for layer in (ka.PositionalEncoding(), ka.RotaryEmbedding()):
        inputs = x if isinstance(layer, ka.RotaryEmbedding) else x[:, :, 0]
        with pytest.raises(ValueError, match="start_index=-2"):
            layer(inputs, start_index=index_forms(-2)[form])


def traced(fn):
    """`fn` traced by the backend's compiler, so that its index argument
    has no value while the layer runs."""
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)
    import tensorflow as tf

    return tf.function(fn, autograph=False)


@pytest.mark.skipif(BACKEND == "torch", reason="PyTorch runs eagerly")
def test_traced_indices_are_clipped(attention):
    """A traced index past the end is clipped so that the tokens fit:
    the last slots of the cache, the last rows of the table."""
    cache = np.zeros((B, 2, S_MAX, 2, D // 2), "float32")
    step = np.ones((B, 1, D), "float32")

    def write(index):
        return attention(step, cache=cache, cache_index=index)[1]

    clipped = to_numpy(traced(write)(ops.convert_to_tensor(7, "int32")))
    last = to_numpy(write(3))
    np.testing.assert_allclose(clipped, last, atol=1e-6)
    assert runtime.static_int(ops.convert_to_tensor(7)) == 7

    embedding = ka.PositionEmbedding(6)
    x = np.zeros((B, 2, D), "float32")
    embedding(x)

    def embed(index):
        return embedding(x, start_index=index)

    clipped = to_numpy(traced(embed)(ops.convert_to_tensor(9, "int32")))
    np.testing.assert_allclose(clipped, to_numpy(embed(4)), atol=1e-6)


def test_static_int_reads_every_known_form():
    for form in index_forms(3):
        assert runtime.static_int(form) == 3
    assert runtime.static_int(None) is None
    assert runtime.static_int(True) is None
    assert runtime.static_int(keras.KerasTensor((), "int32")) is None


def test_variable_index_is_read_like_a_tensor():
    layer = ka.PositionEmbedding(6)
    index = keras.Variable(9, dtype="int32", trainable=False)
    with pytest.raises(ValueError, match="start_index=9"):
        layer(np.zeros((B, 2, D), "float32"), start_index=index)
    assert runtime.static_int(index) == 9


def test_more_tokens_than_the_cache_are_refused_whatever_the_index(
    attention,
):
    cache = np.zeros((B, 2, 2, 2, D // 2), "float32")
    with pytest.raises(ValueError, match="3 positions do not fit"):
        attention(np.ones((B, 3, D), "float32"), cache=cache, cache_index=0)
