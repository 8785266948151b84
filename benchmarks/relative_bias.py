"""T5's relative position bias: a T5-style encoder layer against
keras-hub's T5 layer.

On the active backend, training steps (one `train_on_batch`, MSE to
zeros, SGD, compiled as Keras compiles by default) of a pre-LN encoder
layer with T5's learned, bucketed relative position bias (Raffel et al.
2020; 32 buckets, maximum distance 128, bidirectional), D=512, 8 heads of
64, feed-forward 2048 (ReLU), no dropout, float32, side by side in one
process:

* `ours`: `TransformerEncoderBlock(normalize_first=True, use_bias=False,
  use_rms_norm=True, score_mod=RelativePositionBias())`, T5's layer
  (the unit tests check that it equals keras-hub's, given its weights),
  the bias applied as a score mod on whichever path attention takes;
* `keras_hub`: `keras_hub`'s `T5TransformerLayer` (encoder, owning its
  relative attention bias), which adds the `(1, N, T, T)` bias to dense
  logits.

The attention alone is timed too, forward and backward (the gradients of
the query, key, value and the `(32, N)` table), with the bias given two
ways on the path the dispatch picks:

* `kernel_library`: `mods.relative_position_bias(table)`, which the
  blockwise path lays along each block's diagonals (one lookup per
  relative position);
* `kernel_elementwise`: the same bias as a score mod written by hand,
  one bucket and table lookup per logit.

    KERAS_BACKEND=jax python benchmarks/relative_bias.py [--quick]
"""

import argparse

import numpy as np

D, N, FF, BATCH = 512, 8, 2048, 4
CANDIDATES = ("ours", "keras_hub")


def layer_of(candidate):
    import keras_attention as ka

    if candidate == "ours":
        bias = ka.RelativePositionBias()
        return ka.TransformerEncoderBlock(
            N,
            FF,
            layer_norm_epsilon=1e-6,
            normalize_first=True,
            use_bias=False,
            use_rms_norm=True,
            score_mod=bias,
        )
    from keras_hub.src.models.t5.t5_transformer_layer import T5TransformerLayer

    return T5TransformerLayer(
        is_decoder=False,
        hidden_dim=D,
        intermediate_dim=FF,
        key_value_dim=D // N,
        dropout=0.0,
        activation="relu",
        layer_norm_epsilon=1e-6,
        num_heads=N,
        use_relative_attention_bias=True,
    )


def model_of(candidate, length):
    """A compiled model of the candidate, its inputs and target."""
    import keras

    x = keras.Input((length, D), batch_size=BATCH)
    out = layer_of(candidate)(x)
    if isinstance(out, tuple):  # keras-hub's layer: (states, position bias)
        out = out[0]
    model = keras.Model(x, out)
    model.compile(optimizer="sgd", loss="mse")
    data = np.random.default_rng(0).normal(size=(BATCH, length, D))
    data = data.astype("float32")
    return model, data, np.zeros_like(data)


def kernel_steps(length):
    """`{name: fn}`: forward and backward of attention alone with T5's
    bias as the library's mod and as a hand-written elementwise one."""
    import keras
    from common import gradient_step

    from keras_attention import functional
    from keras_attention import mods

    rng = np.random.default_rng(0)
    q, k, v, cotangent = (
        keras.ops.convert_to_tensor(
            rng.normal(size=(BATCH, length, N, D // N)).astype("float32")
        )
        for _ in range(4)
    )
    table = keras.ops.convert_to_tensor(
        rng.normal(size=(32, N)).astype("float32")
    )

    def elementwise(table):
        def mod(score, batch, head, q_idx, kv_idx):
            bucket = mods.relative_position_bucket(kv_idx - q_idx)
            flat = keras.ops.reshape(table, (-1,))
            return score + keras.ops.take(flat, bucket * N + head)

        return mod

    def step(make_mod):
        def loss(q, k, v, table):
            out = functional.scaled_dot_product_attention(
                q, k, v, score_mod=make_mod(table)
            )
            return keras.ops.sum(out * cotangent)

        return gradient_step(loss, q, k, v, table)

    return {
        "kernel_library": step(mods.relative_position_bias),
        "kernel_elementwise": step(elementwise),
    }


def explained(length):
    """The path `explain()` names for our layer's attention."""
    import keras_attention as ka

    layer = ka.MultiHeadSelfAttention(N, score_mod=ka.RelativePositionBias())
    layer.build((BATCH, length, D))
    return layer.explain(length).path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    from common import interleaved_medians
    from common import write

    lengths = (256,) if args.quick else (512, 2048)
    repeats = 2 if args.quick else 5
    rows = []
    for length in lengths:
        steps = {}
        for candidate in CANDIDATES:
            model, inputs, target = model_of(candidate, length)
            steps[candidate] = lambda m=model, i=inputs, t=target: (
                m.train_on_batch(i, t)
            )
        steps.update(kernel_steps(length))
        medians = interleaved_medians(steps, repeats)
        path = explained(length)
        for candidate, seconds in medians.items():
            rows.append(
                {
                    "name": candidate,
                    "length": length,
                    "seconds": seconds,
                    "path": path,
                }
            )
            print(
                f"{candidate:18s} T={length}: {seconds * 1e3:8.1f} ms "
                f"(our path {path})"
            )
        del steps
    write("relative_bias", {"batch": BATCH, "rows": rows})


if __name__ == "__main__":
    main()
