"""Choosing a path: the reference against the blockwise kernel, and the
blockwise kernel against the matmuls it is made of.

On the active backend at B=8, 8 heads of 64, float32, forward and
backward (the gradients of the query, key and value, compiled as Keras
compiles a training step: `jax.jit`, a TensorFlow graph without XLA), at
T = S = 512, 1024, 2048, with and without the causal band:

* the reference path and the blockwise path, each forced, and the path
  the dispatch picks; `cost` is the blockwise path's time over the
  reference's per block pair it visits, the factor `dispatch.
  BLOCKWISE_COST` is fitted to;
* the blockwise kernel's time against the time the same block-shaped
  matmuls take alone in the same process (a batch of `B x N` blocks of
  C x 64 @ 64 x C and C x C @ C x 64, in the kernel's blocks of C = 256
  or 512 rows): its matmul efficiency.

PyTorch runs its fused kernel, not these paths, so only TensorFlow and
JAX are measured.

    KERAS_BACKEND=jax python benchmarks/paths.py [--quick]
"""

import argparse
import statistics

import keras
import numpy as np
from common import BACKEND
from common import attention_step
from common import interleaved_medians
from common import write

from keras_attention import _kernels
from keras_attention import functional
from keras_attention._core import Structure

B, N, H = 8, 8, 64
C = _kernels.CHUNK_SIZE
BLOCKS = (C, 512)  # the default blocks and the largest any backend takes


def block_matmuls():
    """`{name: fn}`: one batch of each block-shaped matmul of the kernel,
    in both block sizes, compiled as the kernel is (`jax.jit`; a graph
    without XLA)."""
    rng = np.random.default_rng(0)
    shapes = {}
    for c in BLOCKS:
        shapes[f"logits_{c}"] = ((B * N, c, H), (B * N, H, c))
        shapes[f"values_{c}"] = ((B * N, c, c), (B * N, c, H))
    if BACKEND == "jax":
        import jax

        matmul = jax.jit(keras.ops.matmul)
    else:
        import tensorflow as tf

        # One element back: reading the whole product out of the graph
        # would time a copy as well.
        matmul = tf.function(lambda a, b: keras.ops.matmul(a, b)[0, 0, 0])
    fns = {}
    for name, (a, b) in shapes.items():
        a, b = (
            keras.ops.convert_to_tensor(rng.normal(size=s).astype("float32"))
            for s in (a, b)
        )
        fns[name] = lambda a=a, b=b: matmul(a, b)
    return fns


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if BACKEND == "torch":
        print("PyTorch runs its fused kernel: nothing to measure")
        return
    lengths = (512,) if args.quick else (512, 1024, 2048)
    repeats = 3 if args.quick else 5
    matmuls = interleaved_medians(block_matmuls(), repeats=20)
    # Forward: the logits and the values (2 matmuls); backward: the logits
    # again and the value, weight, key and query gradients (5): 3 of the
    # logits' shape and 4 of the values', each 2 C^2 H flops a block.
    pair_seconds = {
        c: 3 * matmuls[f"logits_{c}"] + 4 * matmuls[f"values_{c}"]
        for c in BLOCKS
    }
    rows = []
    for length in lengths:
        for causal in (False, True):
            steps = {
                path: attention_step(
                    (B, length, N, H), causal, None if path == "auto" else path
                )
                for path in ("reference", "chunked", "auto")
            }
            times = interleaved_medians(steps, repeats=repeats)
            q = keras.KerasTensor((B, length, N, H))
            report = functional.explain(q, q, q, is_causal=causal)
            # The block size the forced blockwise path takes here.
            structure = Structure.from_args(where="paths", is_causal=causal)
            block = _kernels.dispatch.chunk_size(
                structure, None, (length, length)
            )
            blocks = -(-length // block)
            visited = blocks * (blocks + 1) // 2 if causal else blocks**2
            fraction = visited / blocks**2
            cost = times["chunked"] / (fraction * times["reference"])
            efficiency = visited * pair_seconds[block] / times["chunked"]
            rows.append({
                "T": length, "causal": causal, "auto_path": report.path,
                "block": block,
                "visited_fraction": fraction, "cost": cost,
                "matmul_efficiency": efficiency,
                **{f"{path}_ms": t * 1e3 for path, t in times.items()},
            })  # fmt: skip
            print(
                f"T={length:5d} causal={causal!s:5s} "
                + "  ".join(f"{p} {t * 1e3:7.0f} ms" for p, t in times.items())
                + f"  auto={report.path}  cost {cost:.2f}"
                + f"  matmul efficiency {efficiency:.2f}"
            )
    fitted = statistics.median(row["cost"] for row in rows)
    print(f"blockwise cost per block pair: {fitted:.2f} "
          f"(dispatch.BLOCKWISE_COST: "
          f"{_kernels.dispatch.BLOCKWISE_COST[BACKEND]})")  # fmt: skip
    write(
        "paths",
        {
            "B": B, "N": N, "H": H, "block": C, "rows": rows,
            "fitted_cost": fitted,
            "dispatch_cost": _kernels.dispatch.BLOCKWISE_COST[BACKEND],
            "block_matmul_ms": {k: v * 1e3 for k, v in matmuls.items()},
        },
    )  # fmt: skip


if __name__ == "__main__":
    main()
