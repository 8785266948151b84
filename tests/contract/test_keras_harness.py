"""Keras's own layer test harness, `run_layer_test`, on every public layer.

It is what Keras runs on its own layers: a config and serialization round
trip, `build` from shapes, a symbolic and an eager call with the expected
output shapes and dtype, weight and seed-generator counts (on torch also
the tracked parameters, which catches variables that share a path), a
training step (single-input layers: Keras's harness calls the layer on one
tensor) and mixed precision (not on torch CPU, where Keras skips it). Each
case also checks `compute_output_shape`, which the harness leaves to
`compute_output_spec`, unbuilt and with an unknown batch.

The cases are the registry's (`tests/contract/registry.py`).
"""

import keras
import pytest
from absl.testing import parameterized
from keras.src import testing

from tests.contract import registry

# Keras's training step fits on a generator with the default shuffle=True.
pytestmark = pytest.mark.filterwarnings(
    "ignore:`shuffle=True` was passed:UserWarning"
)


def _unknown_batch(shape):
    return (None, *shape[1:])


class KerasLayerHarnessTest(testing.TestCase):
    @parameterized.named_parameters(registry.CASES.items())
    def test_run_layer_test(self, arguments):
        input_shape = arguments["input_shape"]
        expected_shape = arguments["expected_output_shape"]
        multi_input = isinstance(input_shape, dict)
        trainable = arguments["expected_num_trainable_weights"]
        self.run_layer_test(
            **arguments,
            expected_output_dtype=keras.tree.map_shape_structure(
                lambda _: "float32", expected_shape
            ),
            expected_num_non_trainable_weights=0,
            expected_num_losses=0,
            supports_masking=True,
            # Keras's training step calls the layer on one tensor, and warns
            # (an error here) when there is nothing to train.
            run_training_check=not multi_input and trainable > 0,
        )
        if isinstance(expected_shape[0], tuple):  # (outputs, scores)
            expected_shape = expected_shape[0]
        layer = arguments["layer_cls"](**arguments["init_kwargs"])
        if multi_input:
            shapes = {k: _unknown_batch(v) for k, v in input_shape.items()}
            got = layer.compute_output_shape(**shapes)
        else:
            got = layer.compute_output_shape(_unknown_batch(input_shape))
        self.assertEqual(tuple(got), _unknown_batch(expected_shape))
