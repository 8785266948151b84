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
                f"{candidate:10s} T={length}: {seconds * 1e3:8.1f} ms "
                f"(our path {path})"
            )
        del steps
    write("relative_bias", {"batch": BATCH, "rows": rows})


if __name__ == "__main__":
    main()
