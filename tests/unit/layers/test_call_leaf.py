"""What `sublayers.call_leaf` relies on in Keras, checked on each leaf
class it takes: if Keras changes one of these, the shortcut past
`Layer.__call__` is no longer exact and this fails."""

import inspect

import keras
import numpy as np
import pytest

from keras_attention.layers.sublayers import LEAVES
from keras_attention.layers.sublayers import call_leaf
from tests.helpers import to_numpy


def _leaf(cls, dtype="float32"):
    layer = {
        keras.layers.Dense: lambda: keras.layers.Dense(3, dtype=dtype),
        keras.layers.EinsumDense: lambda: keras.layers.EinsumDense(
            "btd,dh->bth", (None, 3), bias_axes="h", dtype=dtype
        ),
        keras.layers.LayerNormalization: lambda: (
            keras.layers.LayerNormalization(dtype=dtype)
        ),
        keras.layers.RMSNormalization: lambda: keras.layers.RMSNormalization(
            dtype=dtype
        ),
        keras.layers.Dropout: lambda: keras.layers.Dropout(0.5, dtype=dtype),
    }[cls]()
    layer.build((2, 5, 4))
    return layer


@pytest.mark.parametrize("cls", LEAVES, ids=[c.__name__ for c in LEAVES])
def test_call_takes_one_tensor_and_nothing_call_fills_in(cls):
    """`__call__` fills in `mask` (and `<argument>_mask`) arguments from
    implicit masks and `training` from the context: a leaf whose `call`
    read one of them would differ when called past `__call__`. `training`
    may be taken and is passed through `__call__` when it is true."""
    parameters = list(inspect.signature(cls.call).parameters.values())[1:]
    assert parameters[0].default is inspect.Parameter.empty  # the input
    extra = {p.name: p.default for p in parameters[1:]}
    assert set(extra) <= {"training"}
    assert all(default in (None, False) for default in extra.values())


@pytest.mark.parametrize("cls", LEAVES, ids=[c.__name__ for c in LEAVES])
def test_the_public_attributes_read_mean_what_they_are_used_for(cls):
    x = keras.ops.convert_to_tensor(
        np.random.default_rng(0).normal(size=(2, 5, 4)).astype("float32")
    )
    layer = _leaf(cls)
    assert layer.built and layer.quantization_mode is None
    assert layer.compute_dtype == layer.variable_dtype == "float32"
    # Inference: `call` gives what `__call__` gives (Dropout: x itself).
    expected = to_numpy(layer(x, training=False))
    np.testing.assert_array_equal(to_numpy(call_leaf(layer, x)), expected)
    # Mixed precision: the variables are not in the compute dtype, and
    # only `__call__` autocasts them.
    mixed = _leaf(cls, "mixed_bfloat16")
    assert mixed.compute_dtype == "bfloat16" != mixed.variable_dtype
    out = call_leaf(mixed, keras.ops.cast(x, "bfloat16"))
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"


@pytest.mark.parametrize(
    "cls", [keras.layers.Dense, keras.layers.EinsumDense], ids=str
)
def test_a_quantized_projection_reports_its_mode(cls):
    """`quantize` sets `quantization_mode`, which sends the call through
    `__call__` (the quantized kernel's own call path)."""
    layer = _leaf(cls)
    x = keras.ops.ones((2, 5, 4))
    before = to_numpy(layer(x))
    layer.quantize("int8")
    assert layer.quantization_mode == "int8"
    np.testing.assert_allclose(to_numpy(call_leaf(layer, x)), before, atol=0.05)
