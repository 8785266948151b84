"""Every public layer survives its config and a `.keras` file.

Run over the registry of layer cases (`tests/contract/registry.py`): a
layer rebuilt from its config is the same layer (same config, and with
the weights copied the same outputs), and a functional model around it
saved to `.keras` and loaded back (default `safe_mode=True`, no
`custom_objects`) gives identical outputs.
"""

import copy

import keras
import numpy as np
import pytest

from tests.contract import registry
from tests.helpers import to_numpy


def test_every_public_layer_has_a_case():
    covered = {case["layer_cls"] for case in registry.CASES.values()}
    # A layer that runs inside another (a score mod) is covered by the
    # cases that hold it.
    covered |= {
        # A copy: a config's `from_config` may consume it (StackedRNNCells).
        type(keras.saving.deserialize_keras_object(copy.deepcopy(argument)))
        for case in registry.CASES.values()
        for argument in case["init_kwargs"].values()
        if isinstance(argument, dict) and "registered_name" in argument
    }
    assert registry.public_layer_classes() <= covered


@pytest.mark.parametrize("name", registry.CASES)
def test_config_round_trip_gives_the_same_layer(name):
    args, kwargs = registry.call_inputs(name)
    layer = registry.make(name)
    want = to_numpy(registry.outputs_of(layer(*args, **kwargs)))
    config = layer.get_config()
    clone = layer.__class__.from_config(config)
    assert clone.get_config() == config
    clone(*args, **kwargs)
    clone.set_weights(layer.get_weights())
    got = to_numpy(registry.outputs_of(clone(*args, **kwargs)))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", registry.CASES)
def test_saved_model_loads_with_identical_outputs(name, tmp_path):
    inputs = registry.symbolic_inputs(name)
    layer = registry.make(name)
    outputs = registry.call(name, layer, inputs)
    model = keras.Model(inputs, outputs)
    data = registry.tensors(name)
    before = keras.tree.flatten(model(data))
    model.save(tmp_path / "model.keras")
    restored = keras.saving.load_model(tmp_path / "model.keras")
    after = keras.tree.flatten(restored(data))
    assert len(after) == len(before)
    for a, b in zip(after, before, strict=True):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
