"""Attention structure as arguments: what a sliding window and packed
sequences are worth.

On the active backend, `MultiHeadSelfAttention` (D=512, 8 heads, float32)
training steps (one `train_on_batch`, MSE to zeros, SGD, compiled as Keras
compiles by default), side by side in one process, the candidates of
each comparison timed in turn within each repeat:

* **Sliding window**, B=2, T=4096, a causal window of 256 keys:
  `window` is the layer with `sliding_window=256`; `window_as_mask` the
  same layer given the same structure as a dense `attention_mask`
  `(B, T, T)`; `keras_mha_window_mask` is
  `keras.layers.MultiHeadAttention` with that mask. Each one's peak
  training memory is measured in its own process (as in `memory.py`).
* **Packed sequences**: 48 sequences of 32-512 tokens (the same ones for
  both), as a padded batch (48 rows of 512, `padding_mask`) or packed
  into rows of 1024 (`segment_ids`); real tokens per second of a
  training step, causal attention.

    KERAS_BACKEND=jax python benchmarks/structure.py [--quick]
"""

import argparse
import json
import subprocess
import sys

import numpy as np

D, N = 512, 8
WINDOW_BATCH, WINDOW = 2, 256
WINDOW_CANDIDATES = ("window", "window_as_mask", "keras_mha_window_mask")
SEQUENCES, PACKED_ROW = 48, 1024


def window_model(name, length):
    """A compiled model of the candidate and its inputs."""
    import keras

    import keras_attention as ka
    from keras_attention import functional

    x = keras.Input((length, D), batch_size=WINDOW_BATCH)
    mask = keras.Input((length, length), batch_size=WINDOW_BATCH, dtype=bool)
    if name == "window":
        layer = ka.MultiHeadSelfAttention(N, D // N, sliding_window=WINDOW)
        model = keras.Model(x, layer(x, use_causal_mask=True))
    elif name == "window_as_mask":
        layer = ka.MultiHeadSelfAttention(N, D // N)
        model = keras.Model([x, mask], layer(x, attention_mask=mask))
    else:
        layer = keras.layers.MultiHeadAttention(N, D // N)
        model = keras.Model([x, mask], layer(x, x, attention_mask=mask))
    model.compile(optimizer="sgd", loss="mse")
    rng = np.random.default_rng(0)
    data = rng.normal(size=(WINDOW_BATCH, length, D)).astype("float32")
    dense = functional.structure_mask(
        length, length, is_causal=True, sliding_window=WINDOW
    )
    dense = np.broadcast_to(
        keras.ops.convert_to_numpy(dense), (WINDOW_BATCH, length, length)
    )
    inputs = data if name == "window" else [data, np.ascontiguousarray(dense)]
    return model, inputs, np.zeros_like(data)


def packed_batches(max_length):
    """The same sequences padded and packed: `(x, padding)` and `(x,
    segment_ids)`, and the number of real tokens."""
    rng = np.random.default_rng(1)
    lengths = rng.integers(max_length // 16, max_length + 1, SEQUENCES)
    padded = np.zeros((SEQUENCES, max_length, D), "float32")
    padding = np.zeros((SEQUENCES, max_length), bool)
    for row, length in enumerate(lengths):
        padded[row, :length] = rng.normal(size=(length, D))
        padding[row, :length] = True
    # First fit: each sequence into the first row with room.
    row_length = 2 * max_length
    rows = []
    for length in sorted(lengths, reverse=True):
        for row in rows:
            if sum(row) + length <= row_length:
                row.append(length)
                break
        else:
            rows.append([length])
    packed = np.zeros((len(rows), row_length, D), "float32")
    ids = np.zeros((len(rows), row_length), "int32")
    for r, row in enumerate(rows):
        start = 0
        for segment, length in enumerate(row, 1):
            packed[r, start : start + length] = rng.normal(size=(length, D))
            ids[r, start : start + length] = segment
            start += length
    return (padded, padding), (packed, ids), int(lengths.sum())


def packing_models(max_length):
    import keras

    import keras_attention as ka

    (padded, padding), (packed, ids), tokens = packed_batches(max_length)
    runs = {}
    for name, x, extra in (
        ("padded", padded, padding),
        ("packed", packed, ids),
    ):
        inputs = keras.Input(x.shape[1:], batch_size=x.shape[0])
        side = keras.Input(extra.shape[1:], batch_size=x.shape[0],
                           dtype=extra.dtype)  # fmt: skip
        layer = ka.MultiHeadSelfAttention(N, D // N)
        argument = "padding_mask" if name == "padded" else "segment_ids"
        outputs = layer(inputs, use_causal_mask=True, **{argument: side})
        model = keras.Model([inputs, side], outputs)
        model.compile(optimizer="sgd", loss="mse")
        runs[name] = (model, [x, extra], np.zeros_like(x), x.shape)
    return runs, tokens


def child(name, length):
    """Peak training-step memory of one window candidate (own process)."""
    from common import BACKEND  # noqa: F401  (imports torch first)
    from memory import print_training_peak

    print_training_peak(*window_model(name, length))


def peak_mib(name, length):
    result = subprocess.run(
        [sys.executable, __file__, "--child", name, str(length)],
        capture_output=True,
        text=True,
        check=False,
    )
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)["peak_mib"]
    print(result.stderr[-2000:], file=sys.stderr)
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", nargs=2)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    from common import interleaved_medians
    from common import median_seconds
    from common import write

    length = 1024 if args.quick else 4096
    max_length = 128 if args.quick else 512
    repeats = 2 if args.quick else 5
    rows = []
    steps = {}
    for name in WINDOW_CANDIDATES:
        model, inputs, target = window_model(name, length)
        steps[name] = lambda m=model, i=inputs, t=target: m.train_on_batch(i, t)
    # Ours in turn; Keras's layer apart: its ~10 GiB steps would slow the
    # next step of ours, which must then map fresh memory.
    keras_mha = steps.pop("keras_mha_window_mask")
    medians = interleaved_medians(steps, repeats)
    medians["keras_mha_window_mask"] = median_seconds(keras_mha, repeats)
    del steps, keras_mha
    for name, seconds in medians.items():
        memory = peak_mib(name, length)
        rows.append({"name": name, "length": length, "seconds": seconds,
                     "peak_mib": memory})  # fmt: skip
        print(f"{name:24s} T={length}: {seconds * 1e3:8.1f} ms, {memory} MiB")
    runs, tokens = packing_models(max_length)
    medians = interleaved_medians(
        {name: lambda m=model, i=inputs, t=target: m.train_on_batch(i, t)
         for name, (model, inputs, target, _) in runs.items()},
        repeats,
    )  # fmt: skip
    for name, (_, _, _, shape) in runs.items():
        seconds = medians[name]
        rows.append({"name": name, "rows": shape[0], "row_length": shape[1],
                     "tokens": tokens, "seconds": seconds,
                     "tokens_per_s": tokens / seconds})  # fmt: skip
        print(
            f"{name:8s} {shape[0]} x {shape[1]}: {tokens / seconds:.0f} tok/s"
        )
    write(
        "structure",
        {"window": WINDOW, "window_batch": WINDOW_BATCH, "rows": rows},
    )


if __name__ == "__main__":
    main()
