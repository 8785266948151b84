"""Saves or loads the every-layer checkpoint model in a fresh process.

    KERAS_BACKEND=jax python tests/integration/checkpoint_worker.py save D
    KERAS_BACKEND=torch python tests/integration/checkpoint_worker.py load D

`save` builds `build_model()` and writes `model.keras`,
`model.weights.h5`, the inputs and the model's outputs on them into the
folder D. `load` takes one or more folders and restores both files of
each on its own backend (`.keras` with the default `safe_mode=True` and
no `custom_objects`; `.weights.h5` into a freshly built model), printing
a JSON line per folder with the largest difference from the saved
outputs. Used by tests/integration/test_checkpoints.py.
"""

import json
import os
import sys
from pathlib import Path

if os.environ.get("KERAS_BACKEND") == "torch":
    import torch  # noqa: F401  (torch before tensorflow, see conftest.py)

import keras
import numpy as np

import keras_attention as ka

VOCAB, D = 20, 8


def build_model():
    """A model that uses every public layer of keras_attention."""
    source = keras.Input((None,), dtype="int32", name="source")
    target = keras.Input((None,), dtype="int32", name="target")
    x = keras.layers.Embedding(VOCAB, D, mask_zero=True, name="embed")(source)
    x = ka.PositionalEncoding(name="positions")(x)
    x = ka.TransformerEncoderBlock(2, 16, use_rotary=True, name="encoder")(x)
    y = keras.layers.Embedding(VOCAB, D, mask_zero=True)(target)
    y = ka.PositionEmbedding(16)(y)
    t = ka.TransformerDecoderBlock(2, 16, num_key_value_heads=1)(y, x)
    t = ka.MultiHeadSelfAttention(2)(t, use_causal_mask=True)
    t = ka.CrossAttention(2)(t, x)
    r = keras.layers.Embedding(VOCAB, D)(target)  # unmasked: Reshape drops
    heads = keras.layers.Reshape((-1, 2, D // 2))(r)  # (B, T, N, H)
    r = keras.layers.Reshape((-1, D))(ka.RotaryEmbedding()(heads))
    bahdanau = ka.AttentionDecoder(
        keras.layers.GRUCell(D), ka.BahdanauAttention(6, normalize=True)
    )(y, x)
    luong = ka.AttentionDecoder(
        keras.layers.LSTMCell(D),
        ka.LuongAttention("concat", units=6, scale=True),
        attention_dim=D,
    )(y, x)
    location = ka.AttentionDecoder(
        keras.layers.GRUCell(D),
        ka.LocationSensitiveAttention(6, filters=4, kernel_size=3),
    )(y, x)
    monotonic = ka.AttentionDecoder(
        keras.layers.GRUCell(D),
        ka.MonotonicAttention(
            score="luong",
            mode="recursive",
            sigmoid_noise=0.5,
            inference_mode="hard",
        ),
        flow="luong",
    )(y, x)
    combined = keras.layers.Concatenate()(
        [t, r, bahdanau, luong, location, monotonic]
    )
    logits = keras.layers.Dense(VOCAB)(combined)
    return keras.Model([source, target], logits)


def inputs():
    rng = np.random.default_rng(0)
    source = rng.integers(1, VOCAB, (3, 7)).astype("int32")
    target = rng.integers(1, VOCAB, (3, 5)).astype("int32")
    source[0, 4:], target[1, 3:] = 0, 0  # padding
    return [source, target]


def outputs(model):
    return keras.ops.convert_to_numpy(model(inputs())).astype("float64")


def save(folder):
    keras.utils.set_random_seed(0)
    model = build_model()
    model.save(folder / "model.keras")
    model.save_weights(folder / "model.weights.h5")
    np.save(folder / "outputs.npy", outputs(model))


def load(folder):
    expected = np.load(folder / "outputs.npy")
    restored = keras.models.load_model(folder / "model.keras")
    keras.utils.set_random_seed(1)  # other initial weights than the saved
    rebuilt = build_model()
    before = np.max(np.abs(outputs(rebuilt) - expected))
    rebuilt.load_weights(folder / "model.weights.h5")
    result = {
        "keras": float(np.max(np.abs(outputs(restored) - expected))),
        "weights_h5": float(np.max(np.abs(outputs(rebuilt) - expected))),
        "before_loading": float(before),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    command, *folders = sys.argv[1:]
    for folder in folders:
        {"save": save, "load": load}[command](Path(folder))
