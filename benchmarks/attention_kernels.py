"""Forward time of scaled dot-product attention, side by side in one run.

Compares, on the active Keras backend, at B=8, N=8 heads, H=64 (D=512):
`keras_attention.functional.scaled_dot_product_attention` as dispatched
(fused kernel where the backend has one), its reference path (the one
that also returns the weights) and `keras.ops.dot_product_attention`.
Reports the median of several runs and each as a ratio to Keras's op.

    KERAS_BACKEND=torch python benchmarks/attention_kernels.py [--quick]

Results go to stdout and, as JSON, to `benchmarks/results/`.
"""

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_attention import functional  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def compiled(fn):
    """The backend's compiled form of `fn`, as a user would run it."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.jit(fn)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True)
    return fn


def block(result):
    result = result[0] if isinstance(result, tuple) else result
    return keras.ops.convert_to_numpy(keras.ops.sum(result))


def median_seconds(fn, args, repeats):
    block(fn(*args))  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        block(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    lengths = (128, 256) if args.quick else (128, 512, 1024)
    repeats = 3 if args.quick else 7
    batch, heads, head_dim = 8, 8, 64
    candidates = {
        "ours": lambda q, k, v, m: functional.scaled_dot_product_attention(
            q, k, v, mask=m
        ),
        "ours_reference": lambda q, k, v, m: (
            functional.scaled_dot_product_attention(
                q, k, v, mask=m, return_attention_scores=True
            )
        ),
        "keras_ops": lambda q, k, v, m: keras.ops.dot_product_attention(
            q, k, v, mask=m
        ),
    }
    rng = np.random.default_rng(0)
    rows = []
    for length in lengths:
        shape = (batch, length, heads, head_dim)
        q, k, v = (
            keras.ops.convert_to_tensor(rng.normal(size=shape), "float32")
            for _ in range(3)
        )
        padding = np.arange(length)[None, :] < rng.integers(
            length // 2, length + 1, size=(batch, 1)
        )
        mask = keras.ops.convert_to_tensor(padding[:, None, None, :])
        timings = {
            name: median_seconds(compiled(fn), (q, k, v, mask), repeats)
            for name, fn in candidates.items()
        }
        row = {"T": length, **{f"{n}_ms": t * 1e3 for n, t in timings.items()}}
        row["ours_vs_keras_ops"] = timings["keras_ops"] / timings["ours"]
        rows.append(row)
        print(
            f"T={length:5d}  "
            + "  ".join(f"{n} {t * 1e3:8.2f} ms" for n, t in timings.items())
            + f"  speed-up vs keras.ops {row['ours_vs_keras_ops']:.2f}x"
        )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"attention_kernels_{keras.backend.backend()}.json"
    out.write_text(
        json.dumps(
            {
                "backend": keras.backend.backend(),
                "machine": platform.processor() or platform.machine(),
                "cpus": os.cpu_count(),
                "B": batch,
                "N": heads,
                "H": head_dim,
                "rows": rows,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
