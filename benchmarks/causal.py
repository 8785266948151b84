"""Causal attention: what skipping the masked half of the work is worth.

On the active backend at B=4, D=512, 8 heads, float32, side by side in one
process:

* training steps (one `train_on_batch`, MSE to zeros, SGD, compiled as
  Keras compiles it by default) of `MultiHeadSelfAttention` with and
  without `use_causal_mask`, and of
  `keras.layers.MultiHeadAttention(use_causal_mask=True)`;
* the attention kernel alone, forward and backward (the gradients of the
  query, key and value): our `scaled_dot_product_attention(...,
  is_causal=True)`, compiled by the backend, against PyTorch's
  `torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)`
  on the same CPU threads;
* the throughput of the matmuls the blockwise kernel is made of, against
  a square matmul and against PyTorch's on the same shapes.

    KERAS_BACKEND=jax python benchmarks/causal.py [--quick]
"""

import argparse

import keras
import numpy as np
from common import attention_step
from common import compiled
from common import interleaved_medians
from common import median_seconds
from common import write

import keras_attention as ka

B, D, N = 4, 512, 8
H = D // N


def layer_step(name, length):
    """One `train_on_batch` of a model holding the named layer."""
    if name == "keras_mha_causal":
        layer = keras.layers.MultiHeadAttention(N, H)
        call = lambda x: layer(x, x, use_causal_mask=True)  # noqa: E731
    else:
        layer = ka.MultiHeadSelfAttention(N, H)
        causal = name == "ours_causal"
        call = lambda x: layer(x, use_causal_mask=causal)  # noqa: E731
    inputs = keras.Input((length, D), batch_size=B)
    model = keras.Model(inputs, call(inputs))
    model.compile(optimizer="sgd", loss="mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(B, length, D)).astype("float32")
    zeros = np.zeros_like(x)
    return lambda: model.train_on_batch(x, zeros)


def torch_kernel_step(length):
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(B, N, length, H, generator=generator, requires_grad=True)
        for _ in range(3)
    )
    cotangent = torch.randn(B, N, length, H, generator=generator)

    def grads():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return torch.autograd.grad((out * cotangent).sum(), (q, k, v))

    return grads


def matmul_profile():
    """GFLOP/s of the matmuls the blockwise kernel runs (a batch of 32
    query blocks of 256 rows against 256 keys, head dim 64) next to a
    square 2048 matmul, compiled by this backend, and PyTorch's on the
    same block shapes: where a kernel made of such matmuls can get."""
    import torch

    rng = np.random.default_rng(0)
    shapes = {
        "matmul_square": ((2048, 2048), (2048, 2048)),
        "matmul_logits_block": ((B * N, 256, H), (B * N, H, 256)),
        "matmul_values_block": ((B * N, 256, 256), (B * N, 256, H)),
    }
    matmul = compiled(lambda x, y: keras.ops.matmul(x, y))
    rows = []
    for name, (a_shape, b_shape) in shapes.items():
        a, b = (
            rng.normal(size=s).astype("float32") for s in (a_shape, b_shape)
        )
        flops = 2 * np.prod(a_shape) * b_shape[-1]
        x, y = keras.ops.convert_to_tensor(a), keras.ops.convert_to_tensor(b)
        ours = median_seconds(lambda x=x, y=y: matmul(x, y), repeats=20)
        tx, ty = torch.from_numpy(a), torch.from_numpy(b)
        theirs = median_seconds(
            lambda tx=tx, ty=ty: torch.matmul(tx, ty), repeats=20
        )
        rows.append({"name": name, "gflops": flops / ours / 1e9,
                     "torch_gflops": flops / theirs / 1e9})  # fmt: skip
        print(f"{name:20s} {flops / ours / 1e9:6.0f} GFLOP/s "
              f"(PyTorch {flops / theirs / 1e9:6.0f})")  # fmt: skip
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    lengths = (512, 1024) if args.quick else (1024, 2048, 4096)
    rows = []
    for length in lengths:
        # The candidates are timed in turn within each repeat, so that
        # load on the machine falls on all alike.
        repeats = 5
        names = ("ours_causal", "ours_full", "keras_mha_causal")
        steps = {name: layer_step(name, length) for name in names}
        for name, seconds in interleaved_medians(steps, repeats, 2).items():
            rows.append({"T": length, "name": name, "train_ms": seconds * 1e3})
            print(f"T={length:5d} {name:18s} train {seconds * 1e3:9.1f} ms")
        del steps
        keras.backend.clear_session()
        kernels = {
            "ours_kernel_causal": attention_step((B, length, N, H), True),
            "torch_sdpa_kernel_causal": torch_kernel_step(length),
        }
        for name, seconds in interleaved_medians(kernels, repeats, 2).items():
            rows.append({"T": length, "name": name, "train_ms": seconds * 1e3})
            print(f"T={length:5d} {name:24s} fwd+bwd {seconds * 1e3:9.1f} ms")
    profile = matmul_profile()
    write("causal", {"B": B, "D": D, "N": N, "rows": rows,
                     "matmul_profile": profile})  # fmt: skip


if __name__ == "__main__":
    main()
