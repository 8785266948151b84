"""Backend selection shared by the example scripts, run before Keras loads.

KERAS_BACKEND is read once, when keras is first imported, so a script's
`--backend` must be applied before that.
"""

import os


def select_backend(name=None):
    """Sets `KERAS_BACKEND` (when `name` is given) and quiets TensorFlow's
    C++ logs; on torch, imports torch first (importing tensorflow before
    torch can crash torch)."""
    if name:
        os.environ["KERAS_BACKEND"] = name
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if os.environ.get("KERAS_BACKEND") == "torch":
        import torch  # noqa: F401
