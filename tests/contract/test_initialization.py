"""Every weight starts from its own random draw.

A Keras initializer without a seed fixes one when it is created, so one
instance shared by the query, key and value kernels (or the two
feed-forward kernels) would start them all equal.
"""

import keras
import numpy as np

import keras_attention as ka
from tests.helpers import to_numpy
from tests.integration.checkpoint_worker import build_model


def assert_no_two_random_weights_equal(weights):
    seen = {}
    checked = 0
    for weight in weights:
        values = to_numpy(weight).ravel()
        if np.unique(values).size == 1:
            continue  # zeros, ones, gains: constant by design
        for path, other in seen.get(values.size, []):
            assert not np.allclose(values, other), (
                f"{weight.path} starts equal to {path}"
            )
        seen.setdefault(values.size, []).append((weight.path, values))
        checked += 1
    return checked


def test_a_model_of_every_layer():
    keras.utils.set_random_seed(3)
    checked = assert_no_two_random_weights_equal(build_model().weights)
    assert checked >= 20


def test_one_initializer_instance_for_all_projections():
    keras.utils.set_random_seed(4)
    initializer = keras.initializers.GlorotUniform()
    x = np.zeros((1, 3, 16), "float32")
    layers = [
        ka.MultiHeadSelfAttention(2, kernel_initializer=initializer),
        ka.TransformerEncoderBlock(2, 16, kernel_initializer=initializer),
        ka.BahdanauAttention(16, kernel_initializer=initializer),
        ka.LuongAttention("concat", units=16, kernel_initializer=initializer),
    ]
    layers[0](x)
    layers[1](x)
    layers[2](x, x)
    layers[3](x, x)
    for layer in layers:
        assert assert_no_two_random_weights_equal(layer.weights) >= 3


def test_a_plain_function_initializer():
    def ones(shape, dtype=None):
        return keras.ops.ones(shape, dtype=dtype)

    layer = ka.MultiHeadSelfAttention(2, kernel_initializer=ones)
    layer(np.zeros((1, 3, 8), "float32"))
    np.testing.assert_array_equal(to_numpy(layer.query_dense.kernel), 1.0)
