"""int8 post-training quantization of a decoder-only LM: speed and size.

A decoder-only language model (token embedding, 2 `TransformerDecoderBlock`
with d=256, 4 heads, feed-forward 1024, output projection to a vocabulary
of 1000) in float32, and the same weights after `model.quantize("int8")`
(every `Dense` / `EinsumDense` projection: per-channel int8 kernels,
activations quantized per token at run time). Measured side by side in one
run: the forward latency of `predict_on_batch` (Keras's compiled predict
function) for a prefill batch and a short one, the bytes of the weights,
the size of the `.keras` file, and how far the int8 logits are from the
float32 ones.

    KERAS_BACKEND=jax python benchmarks/quantization.py [--quick]
"""

import argparse
import tempfile
from pathlib import Path

import keras
import numpy as np
from common import interleaved_medians
from common import write

import keras_attention as ka

VOCAB, D, N, F, LAYERS = 1000, 256, 4, 1024, 2
SHAPES = ((8, 128), (1, 32))  # (batch, length)


def language_model():
    keras.utils.set_random_seed(0)
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, D)(tokens)
    x = ka.PositionEmbedding(256)(x)
    for i in range(LAYERS):
        x = ka.TransformerDecoderBlock(
            N, F, normalize_first=True, name=f"block_{i}"
        )(x)
    x = keras.layers.LayerNormalization()(x)
    logits = keras.layers.Dense(VOCAB)(x)
    return keras.Model(tokens, logits)


def _projections_only(layer):
    return type(layer) in (keras.layers.Dense, keras.layers.EinsumDense)


def weight_bytes(model):
    return sum(
        int(np.prod(w.shape)) * np.dtype(w.dtype).itemsize
        for w in model.weights
    )


def file_bytes(model):
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "model.keras"
        model.save(path)
        return path.stat().st_size


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats = 3 if args.quick else 10
    models = {"float32": language_model(), "int8": language_model()}
    models["int8"].set_weights(models["float32"].get_weights())
    models["int8"].quantize("int8", filters=_projections_only)
    rng = np.random.default_rng(0)
    rows = []
    for batch, length in SHAPES:
        tokens = rng.integers(0, VOCAB, size=(batch, length)).astype("int32")
        times = interleaved_medians(
            {
                name: (lambda m=model, t=tokens: m.predict_on_batch(t))
                for name, model in models.items()
            },
            repeats=repeats,
        )
        reference = np.asarray(models["float32"].predict_on_batch(tokens))
        logits = np.asarray(models["int8"].predict_on_batch(tokens))
        for name, seconds in times.items():
            rows.append(
                {"name": name, "batch": batch, "T": length, "ms": seconds * 1e3}
            )
        rows.append(
            {
                "name": "int8_error",
                "batch": batch,
                "T": length,
                "max_abs_error": float(np.max(np.abs(logits - reference))),
                "relative_error": float(
                    np.max(np.abs(logits - reference))
                    / np.max(np.abs(reference))
                ),
                "argmax_agreement": float(
                    np.mean(logits.argmax(-1) == reference.argmax(-1))
                ),
            }
        )
        print(rows[-3:])
    sizes = [
        {
            "name": name,
            "weight_bytes": weight_bytes(model),
            "file_bytes": file_bytes(model),
        }
        for name, model in models.items()
    ]
    print(sizes)
    write(
        "quantization",
        {
            "vocabulary": VOCAB,
            "D": D,
            "N": N,
            "intermediate_dim": F,
            "layers": LAYERS,
            "rows": rows,
            "sizes": sizes,
        },
    )


if __name__ == "__main__":
    main()
