"""Self-attention layers, forward and training step, side by side.

On the active backend at B=8, D=512, 8 heads, float32, no mask:

* `MultiHeadSelfAttention` vs `keras.layers.MultiHeadAttention`;
* `TransformerEncoderBlock` vs keras-hub's `TransformerEncoder`
  (intermediate dim 2048, post-LN, no dropout);
* on torch also `torch.nn.MultiheadAttention` (forward in eval mode under
  `no_grad`, its inference fast path, and a training step) and raw
  `torch.nn.functional.scaled_dot_product_attention` on projected heads
  (the kernel alone: a floor, not a layer).

A training step is one `train_on_batch` (MSE to zeros, SGD) of a model
holding only the layer, compiled as Keras compiles it by default. Each
time is also given as a fraction of the machine's matmul throughput.

    KERAS_BACKEND=jax python benchmarks/layers.py [--quick]
"""

import argparse

import keras
import numpy as np
from common import BACKEND
from common import compiled
from common import matmul_gflops
from common import median_seconds
from common import write

import keras_attention as ka

B, D, N = 8, 512, 8
H = D // N
FFN = 2048


def attention_flops(length, train):
    """Multiply-adds x 2 of the projections and the attention itself."""
    projections = 4 * 2 * B * length * D * D
    attention = 2 * 2 * B * length * length * D
    return (projections + attention) * (3 if train else 1)


def kernel_flops(length, train):
    """The attention kernel alone (no projections)."""
    return 2 * 2 * B * length * length * D * (3 if train else 1)


def block_flops(length, train):
    feedforward = 2 * 2 * B * length * D * FFN
    return attention_flops(length, train) + feedforward * (3 if train else 1)


def keras_candidates():
    """name -> (layer factory, call, FLOP function)."""
    import keras_hub

    return {
        "ours": (
            lambda: ka.MultiHeadSelfAttention(N, H),
            lambda layer, x: layer(x),
            attention_flops,
        ),
        "keras_mha": (
            lambda: keras.layers.MultiHeadAttention(N, H),
            lambda layer, x: layer(x, x),
            attention_flops,
        ),
        "ours_block": (
            lambda: ka.TransformerEncoderBlock(N, FFN),
            lambda layer, x: layer(x),
            block_flops,
        ),
        "keras_hub_block": (
            lambda: keras_hub.layers.TransformerEncoder(FFN, N),
            lambda layer, x: layer(x),
            block_flops,
        ),
    }


def time_keras(factory, call, x, repeats):
    layer = factory()
    inputs = keras.Input((x.shape[1], D), batch_size=B)
    model = keras.Model(inputs, call(layer, inputs))
    model.compile(optimizer="sgd", loss="mse")
    forward = compiled(lambda x: call(layer, x))
    forward_s = median_seconds(lambda: forward(x), repeats)
    zeros = np.zeros(x.shape, "float32")
    train_s = median_seconds(lambda: model.train_on_batch(x, zeros), repeats)
    return forward_s, train_s


def time_torch_baselines(x, repeats):
    import torch
    import torch.nn.functional as F

    tx = torch.from_numpy(x)
    mha = torch.nn.MultiheadAttention(D, N, batch_first=True)
    optimizer = torch.optim.SGD(mha.parameters(), lr=1e-3)

    def forward():
        with torch.no_grad():
            return mha(tx, tx, tx, need_weights=False)[0]

    def train_step():
        out = mha(tx, tx, tx, need_weights=False)[0]
        loss = (out**2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    mha.eval()
    forward_s = median_seconds(forward, repeats)
    mha.train()
    train_s = median_seconds(train_step, repeats)
    length = x.shape[1]
    q, k, v = (
        torch.randn(B, N, length, H, requires_grad=True) for _ in range(3)
    )

    def sdpa_forward():
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v)

    def sdpa_train():
        out = F.scaled_dot_product_attention(q, k, v)
        out.sum().backward()
        return out

    return {
        "torch_mha": (forward_s, train_s),
        "torch_sdpa_kernel": (
            median_seconds(sdpa_forward, repeats),
            median_seconds(sdpa_train, repeats),
        ),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    lengths = (128, 512) if args.quick else (128, 512, 1024, 2048)
    gflops = matmul_gflops()
    print(f"{BACKEND}: matmul {gflops:.0f} GFLOP/s")
    rows = []
    rng = np.random.default_rng(0)
    # A discarded first round: the first timings of a process run slow
    # (allocator, caches, clock), which would bias whichever goes first.
    warmup = rng.normal(size=(B, lengths[0], D)).astype("float32")
    for factory, call, _ in keras_candidates().values():
        time_keras(factory, call, warmup, repeats=2)
    for length in lengths:
        repeats = 5 if length <= 512 else 3
        x = rng.normal(size=(B, length, D)).astype("float32")
        times = {}
        for name, (factory, call, flops) in keras_candidates().items():
            times[name] = (*time_keras(factory, call, x, repeats), flops)
        if BACKEND == "torch":
            for name, timing in time_torch_baselines(x, repeats).items():
                flops = kernel_flops if "kernel" in name else attention_flops
                times[name] = (*timing, flops)
        for name, (forward_s, train_s, flops) in times.items():
            rows.append(
                {
                    "T": length,
                    "name": name,
                    "forward_ms": forward_s * 1e3,
                    "train_ms": train_s * 1e3,
                    "forward_fraction_of_matmul": flops(length, False)
                    / forward_s
                    / 1e9
                    / gflops,
                    "train_fraction_of_matmul": flops(length, True)
                    / train_s
                    / 1e9
                    / gflops,
                }
            )
            print(
                f"T={length:5d} {name:18s} forward {forward_s * 1e3:9.1f} ms"
                f"  train step {train_s * 1e3:9.1f} ms"
            )
        keras.backend.clear_session()
    write("layers", {"B": B, "D": D, "N": N, "matmul_gflops": gflops,
                     "rows": rows})  # fmt: skip


if __name__ == "__main__":
    main()
