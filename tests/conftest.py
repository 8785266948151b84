"""Test setup shared by the whole suite.

The suite runs once per backend, each in its own process: `KERAS_BACKEND`
is read when keras is first imported, so it is never changed here.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

if os.environ.get("KERAS_BACKEND") == "torch":
    # Importing tensorflow before torch in one process can crash torch;
    # Keras's own test setup imports torch first for the same reason.
    import torch  # noqa: F401

import keras  # noqa: E402
import pytest  # noqa: E402

BACKEND = keras.backend.backend()


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Each test starts from float32, a fixed seed and a clean session."""
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    yield
    keras.config.set_dtype_policy("float32")
    keras.backend.clear_session()
