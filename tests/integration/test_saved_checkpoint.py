"""A model saved by release 0.1.0 loads with identical outputs.

`tests/data/checkpoint_0_1/model.keras` is the every-layer model of
`tests/integration/checkpoint_worker.py`, saved on JAX by keras_attention
0.1.0, with its inputs and outputs. Loading it checks that the saved-file
format (the
registered names, the configs, the variable paths) is unchanged.
"""

from pathlib import Path

import keras
import numpy as np
import pytest

import keras_attention  # noqa: F401  (registers the layers)

DATA = Path(__file__).resolve().parents[1] / "data" / "checkpoint_0_1"


@pytest.fixture(scope="module")
def restored():
    return keras.models.load_model(DATA / "model.keras")


def test_checkpoint_of_0_1_loads_with_identical_outputs(restored):
    inputs = np.load(DATA / "inputs.npz")
    expected = np.load(DATA / "outputs.npy")
    outputs = restored([inputs["source"], inputs["target"]])
    outputs = keras.ops.convert_to_numpy(outputs).astype("float64")
    assert outputs.shape == expected.shape
    # At the real target steps. At padding steps (id 0, masked from the
    # target's embedding) the RNN decoders now repeat their previous
    # output, as Keras's RNN layers do, where 0.1.0 stepped the cell.
    real = inputs["target"] != 0
    assert 0 < real.sum() < real.size
    np.testing.assert_allclose(outputs[real], expected[real], rtol=0, atol=1e-5)


def test_checkpoint_of_0_1_saves_again_with_the_same_variables(
    restored, tmp_path
):
    """Saving the loaded model writes the variables it read, path for path."""
    restored.save(tmp_path / "again.keras")
    again = keras.models.load_model(tmp_path / "again.keras")
    before = {v.path: keras.ops.convert_to_numpy(v) for v in restored.weights}
    after = {v.path: keras.ops.convert_to_numpy(v) for v in again.weights}
    assert sorted(before) == sorted(after)
    for path, value in before.items():
        np.testing.assert_array_equal(after[path], value, err_msg=path)
