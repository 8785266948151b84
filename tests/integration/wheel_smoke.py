"""Smoke test of an installed keras-attention-layers wheel.

Run with the installed interpreter from outside the repository (so that
`keras_attention` is the installed package) and `KERAS_BACKEND` set:
trains a tiny model built from the layers for two steps, saves it as
`.keras`, loads it back without `custom_objects` and checks the outputs.
Used by tests/integration/test_release.py and .github/workflows/release.yml.
"""

import os
import sys
import tempfile

if os.environ.get("KERAS_BACKEND") == "torch":
    import torch  # noqa: F401  (torch before tensorflow, see conftest.py)

import keras
import numpy as np

import keras_attention as ka


def main():
    keras.utils.set_random_seed(0)
    ids = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(50, 16, mask_zero=True)(ids)
    x = ka.PositionalEncoding()(x)
    x = ka.TransformerEncoderBlock(2, 32)(x)
    x = ka.MultiHeadSelfAttention(2, 8)(x, use_causal_mask=True)
    outputs = keras.layers.Dense(50)(x)
    model = keras.Model(ids, outputs)
    model.compile(
        "adam",
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    data = np.random.default_rng(0).integers(1, 50, (8, 6))
    data[:, 4:] = 0  # padding
    history = model.fit(data, data, epochs=2, verbose=0)
    losses = history.history["loss"]
    assert all(np.isfinite(losses)), losses
    expected = keras.ops.convert_to_numpy(model(data))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.keras")
        model.save(path)
        restored = keras.models.load_model(path)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(restored(data)), expected, atol=1e-6
    )
    print(
        f"keras_attention {ka.__version__} from {ka.__file__} on "
        f"{keras.backend.backend()}: trained, saved and reloaded "
        f"(loss {losses[0]:.3f} -> {losses[-1]:.3f})"
    )


if __name__ == "__main__":
    sys.exit(main())
