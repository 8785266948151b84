"""A block converted from keras-hub saves to `.keras` and loads in a fresh
process that cannot import keras-hub.

GPT-2's blocks use keras-hub's registered tanh GELU; the converted block
holds `keras_attention>gelu_approximate` instead, which `import
keras_attention` registers. The worker loads the file with keras-hub
made unimportable and must reproduce the saved outputs.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest

from keras_attention import convert
from tests.helpers import rng

pytestmark = pytest.mark.slow  # a fresh process: runs early

ROOT = Path(__file__).resolve().parents[2]

LOAD = """
import os
import sys

sys.modules["keras_hub"] = None  # `import keras_hub` raises ImportError
sys.modules["keras_nlp"] = None
if os.environ["KERAS_BACKEND"] == "torch":
    import torch  # noqa: F401  (before tensorflow, as in conftest.py)

import keras
import numpy as np

import keras_attention  # noqa: F401  (registers the layers)

model_path, inputs_path, outputs_path = sys.argv[1:]
model = keras.saving.load_model(model_path)
outputs = model(np.load(inputs_path))
np.save(outputs_path, keras.ops.convert_to_numpy(outputs))
"""


def test_a_converted_gpt2_block_loads_without_keras_hub(tmp_path):
    hub = pytest.importorskip("keras_hub")
    backbone = hub.models.GPT2Backbone(
        vocabulary_size=50,
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=8,
    )
    theirs = backbone.get_layer("transformer_layer_0")
    ours = convert.from_keras(theirs)
    x = rng(0).standard_normal((2, 5, 8)).astype("float32")
    want = keras.ops.convert_to_numpy(theirs(x))
    inputs = keras.Input((None, 8))
    model = keras.Model(inputs, ours(inputs))
    expected = keras.ops.convert_to_numpy(model(x))
    np.testing.assert_allclose(expected, want, atol=1e-5)
    model.save(tmp_path / "converted.keras")
    np.save(tmp_path / "inputs.npy", x)
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(LOAD),
            str(tmp_path / "converted.keras"),
            str(tmp_path / "inputs.npy"),
            str(tmp_path / "outputs.npy"),
        ],
        env={**os.environ, "KERAS_BACKEND": keras.backend.backend()},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    got = np.load(tmp_path / "outputs.npy")
    np.testing.assert_allclose(got, expected, atol=1e-6)
