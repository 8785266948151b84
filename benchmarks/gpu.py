"""Attention on an NVIDIA GPU in bfloat16: ours vs the raw fused op.

For the JAX and PyTorch backends (one process each):

    KERAS_BACKEND=jax python benchmarks/gpu.py
    KERAS_BACKEND=torch python benchmarks/gpu.py

times, at B=8, 16 heads of 128 (D=2048), T in {1024, 2048, 4096}, causal:

* `functional.scaled_dot_product_attention` as dispatched (forward, and
  forward + backward);
* the raw fused op: `jax.nn.dot_product_attention(implementation="cudnn")`
  or `torch.nn.functional.scaled_dot_product_attention` (flash);
* a `MultiHeadSelfAttention` training step (projections included).

and reports attention TFLOP/s and ours / raw. Appends a markdown table to
`benchmarks/results/gpu.md`, which `report.py` puts in
docs/performance.md. Without a GPU it runs on the CPU at small sizes
(`--quick`), which checks the script, not the speed.
"""

import argparse
import platform
from pathlib import Path

import keras
import numpy as np
from common import BACKEND
from common import RESULTS
from common import compiled
from common import median_seconds

import keras_attention as ka
from keras_attention import functional

B, N, H = 8, 16, 128


def raw_op(gpu):
    if BACKEND == "jax":
        import jax

        implementation = "cudnn" if gpu else None
        return lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, is_causal=True, implementation=implementation
        )
    import torch.nn.functional as F

    def torch_sdpa(q, k, v):  # torch wants (B, N, T, H)
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return torch_sdpa


def ours(q, k, v):
    return functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def with_backward(fn):
    """fn's forward plus the gradients of sum(out) w.r.t. q, k, v."""
    if BACKEND == "jax":
        import jax

        return jax.grad(
            lambda q, k, v: fn(q, k, v).astype("float32").sum(), (0, 1, 2)
        )

    def step(q, k, v):
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        fn(q, k, v).float().sum().backward()
        return q.grad, k.grad, v.grad

    return step


def gpu_name():
    if BACKEND == "jax":
        import jax

        device = jax.devices()[0]
        return device.device_kind, device.platform == "gpu"
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0), True
    return platform.processor() or "cpu", False


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    name, gpu = gpu_name()
    lengths = (128, 256) if args.quick or not gpu else (1024, 2048, 4096)
    heads, head_dim = (2, 16) if args.quick or not gpu else (N, H)
    rng = np.random.default_rng(0)
    lines = [
        f"### {name}, {BACKEND}, bfloat16, causal, B={B}, "
        f"{heads} heads of {head_dim}",
        "",
        "| T | ours fwd TFLOP/s | raw fwd TFLOP/s | ours / raw | ours "
        "fwd+bwd TFLOP/s | raw fwd+bwd TFLOP/s | ours / raw "
        "| layer train step ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    raw = raw_op(gpu)
    for length in lengths:
        shape = (B, length, heads, head_dim)
        q, k, v = (
            keras.ops.cast(rng.normal(size=shape).astype("float32"), "bfloat16")
            for _ in range(3)
        )
        # Causal attention does half of the 4·B·N·T²·H multiply-adds.
        flops = 2 * B * heads * length * length * head_dim
        timings = {}
        for label, fn in (("ours", ours), ("raw", raw)):
            forward = compiled(fn)
            backward = compiled(with_backward(fn))
            timings[label] = (
                median_seconds(lambda f=forward, a=(q, k, v): f(*a)),
                median_seconds(lambda f=backward, a=(q, k, v): f(*a)),
            )
        layer = ka.MultiHeadSelfAttention(heads, head_dim, dtype="bfloat16")
        inputs = keras.Input((length, heads * head_dim), batch_size=B)
        model = keras.Model(inputs, layer(inputs, use_causal_mask=True))
        model.compile(optimizer="sgd", loss="mse")
        x = rng.normal(size=(B, length, heads * head_dim)).astype("float32")
        step_s = median_seconds(lambda m=model, x=x: m.train_on_batch(x, x))
        (ours_f, ours_b), (raw_f, raw_b) = timings["ours"], timings["raw"]
        lines.append(
            f"| {length} | {flops / ours_f / 1e12:.1f} "
            f"| {flops / raw_f / 1e12:.1f} | {raw_f / ours_f:.2f} "
            f"| {3.5 * flops / ours_b / 1e12:.1f} "
            f"| {3.5 * flops / raw_b / 1e12:.1f} | {raw_b / ours_b:.2f} "
            f"| {step_s * 1e3:.1f} |"
        )
        print(lines[-1], flush=True)
    RESULTS.mkdir(exist_ok=True)
    out = Path(RESULTS / "gpu.md")
    previous = out.read_text() if out.exists() else "## GPU\n\n"
    out.write_text(previous + "\n".join(lines) + "\n\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
