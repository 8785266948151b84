"""The blockwise kernel written and compiled in other forms, on CPU.

The blockwise kernel is made of batched matmuls on `256 x 64` and
`256 x 256` blocks, which XLA:CPU runs well below its square-matmul rate.
This benchmark tries the other ways to write and compile them, at B=8,
8 heads of 64, float32, blocks of 256 (the shapes of
`benchmarks/paths.py`), each against the kernel's own form in the same
run:

* **matmul forms** (GFLOP/s): the logits block `q k^T` and the values
  block `p v` as the kernel writes them (heads folded into the batch,
  `matmul` with the key block's axes swapped); as an `einsum` that
  contracts the last axes (one `dot_general`, no transpose); with the
  heads as their own axis `(B, N, C, H)`; and with the keys stored
  transposed `(P, H, S)`;
* **compiler options**: the same matmuls and the whole kernel (forward
  and backward at T=2048, causal) compiled with XLA:CPU's per-function
  options (`jax.jit(f).lower(...).compile(compiler_options=...)`):
  oneDNN matmuls, library fusion through YNNPACK, XNNPACK or oneDNN, and
  fast math;
* **block sizes**: the whole kernel with blocks of 128, 256 (the
  default) and 512 rows, causal and not.

The first two are JAX's; the block sizes are measured on TensorFlow (a
graph without XLA, as Keras runs a training step there) too. PyTorch
runs its fused kernel instead.

    KERAS_BACKEND=jax python benchmarks/kernel_forms.py [--quick]
"""

import argparse

import keras
import numpy as np
from common import BACKEND
from common import gradient_step
from common import interleaved_medians
from common import write

from keras_attention import _kernels
from keras_attention import functional

B, N, H = 8, 8, 64
C = _kernels.CHUNK_SIZE

# XLA:CPU options a single compiled function accepts (jaxlib 0.10).
OPTIONS = {
    "default": {},
    "onednn": {"xla_cpu_use_onednn": True},
    "ynn_dot": {
        "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"
    },
    "ynn_dot_eltwise": {
        "xla_cpu_experimental_ynn_fusion_type": (
            "LIBRARY_FUSION_TYPE_DOT,LIBRARY_FUSION_TYPE_ELTWISE"
        )
    },
    "xnn_dot": {
        "xla_cpu_experimental_xnn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"
    },
    "onednn_dot": {
        "xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"
    },
    "fast_math": {"xla_cpu_enable_fast_math": True},
}


def random(*shape):
    rng = np.random.default_rng(sum(shape))
    return keras.ops.convert_to_tensor(rng.normal(size=shape).astype("float32"))


def matmul_forms():
    """`{name: (fn, args, flops)}`: each form of the two block matmuls."""
    import jax.numpy as jnp

    p = B * N
    q, k, v = random(p, C, H), random(p, C, H), random(p, C, H)
    weights = random(p, C, C)
    q4, k4 = (jnp.reshape(x, (B, N, C, H)) for x in (q, k))
    v4, w4 = jnp.reshape(v, (B, N, C, H)), jnp.reshape(weights, (B, N, C, C))
    k_t = jnp.swapaxes(k, 1, 2)  # stored transposed: (P, H, C)
    flops = 2 * p * C * C * H
    return {
        "logits_matmul_swapaxes": (
            lambda q, k: jnp.matmul(q, jnp.swapaxes(k, 1, 2)),
            (q, k),
            flops,
        ),
        "logits_einsum": (
            lambda q, k: jnp.einsum("pqh,pkh->pqk", q, k),
            (q, k),
            flops,
        ),
        "logits_heads_axis": (
            lambda q, k: jnp.einsum("bnqh,bnkh->bnqk", q, k),
            (q4, k4),
            flops,
        ),
        "logits_keys_transposed": (jnp.matmul, (q, k_t), flops),
        "values_matmul": (jnp.matmul, (weights, v), flops),
        "values_einsum": (
            lambda w, v: jnp.einsum("pqk,pkh->pqh", w, v),
            (weights, v),
            flops,
        ),
        "values_heads_axis": (
            lambda w, v: jnp.einsum("bnqk,bnkh->bnqh", w, v),
            (w4, v4),
            flops,
        ),
        # The key gradient's form in the backward pass: p^T-shaped.
        "key_grad_matmul_swapaxes": (
            lambda g, q: jnp.matmul(jnp.swapaxes(g, 1, 2), q),
            (weights, q),
            flops,
        ),
        "key_grad_einsum": (
            lambda g, q: jnp.einsum("pqk,pqh->pkh", g, q),
            (weights, q),
            flops,
        ),
    }


def compile_with(fn, args, options):
    """`fn` compiled for `args` with XLA:CPU `options`, as `() -> out`."""
    import jax

    executable = jax.jit(fn).lower(*args).compile(compiler_options=options)
    return lambda: executable(*args)


def kernel_loss(length, causal, chunk_size=None):
    """`(loss, args)`: the blockwise path, forced, with blocks of
    `chunk_size` rows, as a loss of the query, key and value."""
    shape = (B, length, N, H)
    q, k, v, cotangent = (random(*shape) for _ in range(4))

    def loss(q, k, v):
        with _kernels.force("chunked", chunk_size=chunk_size):
            out = functional.scaled_dot_product_attention(
                q, k, v, is_causal=causal
            )
        return keras.ops.sum(out * cotangent)

    return loss, (q, k, v)


def kernel(length, causal, chunk_size=None):
    """`(loss gradient function, args)` of `kernel_loss` on JAX."""
    import jax

    loss, args = kernel_loss(length, causal, chunk_size)
    return jax.grad(loss, argnums=(0, 1, 2)), args


def kernel_flops(length, causal, chunk):
    """Block-matmul flops of forward and backward: 7 matmuls of
    `2 C^2 H` per block pair and head."""
    blocks = -(-length // chunk)
    pairs = blocks * (blocks + 1) // 2 if causal else blocks**2
    return 7 * 2 * chunk * chunk * H * pairs * B * N


def block_sizes(length, repeats, record):
    """The whole kernel, forward and backward, with blocks of 128, 256
    and 512 rows, compiled as Keras compiles a training step."""
    for causal in (False, True):
        timed = {}
        for chunk in (128, 256, 512):
            if BACKEND == "jax":
                grads, a = kernel(length, causal, chunk)
                timed[chunk] = compile_with(grads, a, {})
            else:
                loss, (q, k, v) = kernel_loss(length, causal, chunk)
                timed[chunk] = gradient_step(loss, q, k, v)
        seconds = interleaved_medians(timed, repeats=repeats)
        for chunk in timed:
            record("block size", f"kernel T={length} causal={causal}",
                   f"blocks of {chunk}", seconds[chunk],
                   kernel_flops(length, causal, chunk))  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if BACKEND == "torch":
        print("PyTorch runs its fused kernel: nothing to measure")
        return
    length = 512 if args.quick else 2048
    repeats = 3 if args.quick else 7
    rows = []

    def record(experiment, name, options, seconds, flops):
        rows.append({"experiment": experiment, "name": name,
                     "options": options, "ms": seconds * 1e3,
                     "gflops": flops / seconds / 1e9})  # fmt: skip

    if BACKEND == "tensorflow":
        block_sizes(length, repeats, record)
        write("kernel_forms", {"B": B, "N": N, "H": H, "block": C,
                               "T": length, "rows": rows})  # fmt: skip
        return
    forms = matmul_forms()
    timed = {
        name: compile_with(fn, a, {}) for name, (fn, a, _) in forms.items()
    }
    seconds = interleaved_medians(timed, repeats=4 * repeats)
    for name, (_, _, flops) in forms.items():
        record("matmul form", name, "default", seconds[name], flops)

    for name in ("logits_matmul_swapaxes", "values_matmul"):
        fn, a, flops = forms[name]
        timed = {
            option: compile_with(fn, a, values)
            for option, values in OPTIONS.items()
        }
        seconds = interleaved_medians(timed, repeats=4 * repeats)
        for option in OPTIONS:
            record("compiler options", name, option, seconds[option], flops)

    grads, a = kernel(length, causal=True)
    timed = {
        option: compile_with(grads, a, values)
        for option, values in OPTIONS.items()
    }
    seconds = interleaved_medians(timed, repeats=repeats)
    flops = kernel_flops(length, True, C)
    for option in OPTIONS:
        record("compiler options", f"kernel T={length} causal", option,
               seconds[option], flops)  # fmt: skip

    block_sizes(length, repeats, record)

    for row in rows:
        print(f"{row['experiment']:16s} {row['name']:28s} "
              f"{row['options']:16s} {row['ms']:9.2f} ms "
              f"{row['gflops']:6.0f} GFLOP/s")  # fmt: skip
    write("kernel_forms", {"B": B, "N": N, "H": H, "block": C, "T": length,
                        "rows": rows})  # fmt: skip


if __name__ == "__main__":
    main()
