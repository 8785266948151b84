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
from common import interleaved_medians
from common import matmul_gflops
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


def keras_steps(factory, call, x):
    """(forward, training step) closures of a model holding the layer."""
    layer = factory()
    inputs = keras.Input((x.shape[1], D), batch_size=B)
    model = keras.Model(inputs, call(layer, inputs))
    model.compile(optimizer="sgd", loss="mse")
    forward = compiled(lambda x: call(layer, x))
    zeros = np.zeros(x.shape, "float32")
    return lambda: forward(x), lambda: model.train_on_batch(x, zeros)


def torch_steps(x):
    """name -> (forward, training step) of PyTorch's own layer and of its
    kernel alone on projected heads."""
    import torch
    import torch.nn.functional as F

    tx = torch.from_numpy(x)
    mha = torch.nn.MultiheadAttention(D, N, batch_first=True)
    optimizer = torch.optim.SGD(mha.parameters(), lr=1e-3)

    def forward():
        # Its inference fast path runs in eval mode under no_grad.
        mha.eval()
        with torch.no_grad():
            return mha(tx, tx, tx, need_weights=False)[0]

    def train_step():
        mha.train()
        out = mha(tx, tx, tx, need_weights=False)[0]
        loss = (out**2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

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
        "torch_mha": (forward, train_step),
        "torch_sdpa_kernel": (sdpa_forward, sdpa_train),
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
    for length in lengths:
        # Every candidate is built first and timed in turn within each
        # repeat, so that load on the machine falls on all alike.
        repeats = 7 if length <= 512 else 5
        x = rng.normal(size=(B, length, D)).astype("float32")
        steps, flop_counts = {}, {}
        for name, (factory, call, flops) in keras_candidates().items():
            steps[name] = keras_steps(factory, call, x)
            flop_counts[name] = flops
        if BACKEND == "torch":
            for name, pair in torch_steps(x).items():
                steps[name] = pair
                flop_counts[name] = (
                    kernel_flops if "kernel" in name else attention_flops
                )
        forward = interleaved_medians(
            {name: pair[0] for name, pair in steps.items()}, repeats, warmup=2
        )
        train = interleaved_medians(
            {name: pair[1] for name, pair in steps.items()}, repeats, warmup=2
        )
        times = {
            name: (forward[name], train[name], flop_counts[name])
            for name in steps
        }
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
