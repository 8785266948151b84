"""Mask mods: what skipping the blocks a pattern leaves empty is worth.

On the active backend, `MultiHeadSelfAttention` (D=512, 8 heads, float32,
B=2, T=4096) training steps (one `train_on_batch`, MSE to zeros, SGD,
compiled as Keras compiles by default), side by side in one process, for
three patterns, each given three ways (timed in turn within each
repeat):

* `mod`: the layer with the pattern as a `mask_mod` of
  `keras_attention.mods`;
* `dense`: the same layer with the same pattern as a dense
  `attention_mask` `(B, T, T)`;
* `keras_mha`: `keras.layers.MultiHeadAttention` with that mask.

The patterns: a prefix-LM mask (prefix T/2), a document mask (8
documents of T/8) and chunked attention (chunks of 512). Each row also
records the kernel `explain()` names for its call and the fraction of
block pairs it visits (all of them for a dense mask). A step also runs
the four projections (a fixed cost the pattern does not change), so the
attention alone is timed too, forward and backward (the gradients of the
query, key and value), on `(B, T, N, H)` heads compiled as Keras compiles
a training step: the `mask_mod`, the same mod as a `block_mask` made once
(in the default blocks of 256 and in blocks of 512), and the dense mask.

    KERAS_BACKEND=jax python benchmarks/mods.py [--quick]
"""

import argparse

import numpy as np

D, N, BATCH = 512, 8, 2
CANDIDATES = ("mod", "dense", "keras_mha")
LARGE_BLOCKS = 512  # the blocks of the second block mask


def patterns(length, batch=BATCH):
    """`{name: (mask mod, dense (B, T, T) mask)}` for `batch` rows."""
    from keras import ops

    from keras_attention import mods

    i, j = np.arange(length)[:, None], np.arange(length)[None, :]
    prefix = length // 2
    ids = np.repeat(np.arange(1, 9), length // 8)[None].repeat(batch, 0)
    chunk = min(512, length // 8)
    built = {
        "prefix_lm": (
            mods.prefix_lm(np.full(batch, prefix, "int32")),
            (j < prefix) | (j <= i),
        ),
        "document": (mods.document(ids), ids[0][:, None] == ids[0][None, :]),
        "chunked": (mods.chunked(chunk), i // chunk == j // chunk),
    }
    for name, (mod, dense) in built.items():
        visible = ops.convert_to_numpy(mod(*_grid(length, batch)))
        assert np.array_equal(
            np.broadcast_to(visible, (batch, 1, *dense.shape))[0, 0], dense
        ), name
    return {
        name: (
            mod,
            np.ascontiguousarray(
                np.broadcast_to(dense, (batch, length, length))
            ),
        )
        for name, (mod, dense) in built.items()
    }


def _grid(length, batch):
    return (
        np.arange(batch, dtype="int32").reshape(-1, 1, 1, 1),
        np.zeros((1, 1, 1, 1), "int32"),
        np.arange(length, dtype="int32").reshape(1, 1, -1, 1),
        np.arange(length, dtype="int32").reshape(1, 1, 1, -1),
    )


def model_of(candidate, mod, dense, length):
    """A compiled model of the candidate, its inputs and target."""
    import keras

    import keras_attention as ka

    x = keras.Input((length, D), batch_size=BATCH)
    mask = keras.Input((length, length), batch_size=BATCH, dtype=bool)
    if candidate == "mod":
        layer = ka.MultiHeadSelfAttention(N, D // N)
        model = keras.Model(x, layer(x, mask_mod=mod))
    elif candidate == "dense":
        layer = ka.MultiHeadSelfAttention(N, D // N)
        model = keras.Model([x, mask], layer(x, attention_mask=mask))
    else:
        layer = keras.layers.MultiHeadAttention(N, D // N)
        model = keras.Model([x, mask], layer(x, x, attention_mask=mask))
    model.compile(optimizer="sgd", loss="mse")
    data = np.random.default_rng(0).normal(size=(BATCH, length, D))
    data = data.astype("float32")
    inputs = data if candidate == "mod" else [data, dense]
    return model, inputs, np.zeros_like(data)


def kernel_steps(mod, dense, length):
    """`{name: fn}`: forward and backward of attention alone with the
    pattern as a mod, as a block mask and as a dense mask."""
    import keras

    from keras_attention import functional

    rng = np.random.default_rng(0)
    q, k, v, cotangent = (
        keras.ops.convert_to_tensor(
            rng.normal(size=(BATCH, length, N, D // N)).astype("float32")
        )
        for _ in range(4)
    )
    dense = keras.ops.convert_to_tensor(dense)
    forms = {
        "kernel_mod": {"mask_mod": mod},
        "kernel_block_mask": {"mask_mod": mods_block_mask(mod, length)},
        "kernel_block_mask_512": {
            "mask_mod": mods_block_mask(mod, length, LARGE_BLOCKS)
        },
        "kernel_dense": {"mask": dense},
    }
    return {
        name: attention_step(functional, arguments, q, k, v, cotangent)
        for name, arguments in forms.items()
    }


def mods_block_mask(mod, length, block_size=None):
    """The mod as a block mask of `block_size` (the default blocks)."""
    from keras_attention import mods

    return mods.block_mask(mod, BATCH, N, length, length, block_size)


def attention_step(functional, arguments, q, k, v, cotangent):
    """`fn()`: the gradients of `Σ cotangent · attention(q, k, v)`."""
    import keras
    from common import gradient_step

    def loss(q, k, v):
        out = functional.scaled_dot_product_attention(q, k, v, **arguments)
        return keras.ops.sum(out * cotangent)

    return gradient_step(loss, q, k, v)


def explained(mod, dense, length):
    """`{candidate: (path, fraction of block pairs visited)}`: the path
    `explain()` names for each candidate's call, and the block pairs it
    visits (all of them for a dense mask)."""
    import keras

    from keras_attention import functional

    query = keras.KerasTensor((BATCH, length, N, D // N))
    mask = keras.KerasTensor(dense.shape, dtype="bool")
    forms = {
        "default": mods_block_mask(mod, length),
        "large": mods_block_mask(mod, length, LARGE_BLOCKS),
    }
    visited = {
        name: float(np.mean(keras.ops.convert_to_numpy(table.blocks) > 0))
        for name, table in forms.items()
    }
    by_mod = (
        functional.explain(query, query, mask_mod=mod).path,
        visited["default"],
    )
    by_dense = (functional.explain(query, query, mask=mask).path, 1.0)
    return {
        "mod": by_mod,
        "dense": by_dense,
        "keras_mha": ("keras", 1.0),
        "kernel_mod": by_mod,
        "kernel_block_mask": (
            functional.explain(query, query, mask_mod=forms["default"]).path,
            visited["default"],
        ),
        "kernel_block_mask_512": (
            functional.explain(query, query, mask_mod=forms["large"]).path,
            visited["large"],
        ),
        "kernel_dense": by_dense,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    from common import interleaved_medians
    from common import median_seconds
    from common import write

    length = 1024 if args.quick else 4096
    repeats = 2 if args.quick else 5
    rows = []
    for pattern, (mod, dense) in patterns(length).items():
        steps = {}
        for candidate in CANDIDATES:
            model, inputs, target = model_of(candidate, mod, dense, length)
            steps[candidate] = lambda m=model, i=inputs, t=target: (
                m.train_on_batch(i, t)
            )
        steps.update(kernel_steps(mod, dense, length))
        # Keras's layer apart: its multi-GiB steps would slow the next
        # candidate, which must then map fresh memory.
        keras_mha = steps.pop("keras_mha")
        medians = interleaved_medians(steps, repeats)
        medians["keras_mha"] = median_seconds(keras_mha, repeats)
        paths = explained(mod, dense, length)
        for candidate, seconds in medians.items():
            path, visited = paths[candidate]
            rows.append(
                {
                    "pattern": pattern,
                    "name": candidate,
                    "length": length,
                    "seconds": seconds,
                    "visited": visited,
                    "path": path,
                }
            )
            print(
                f"{pattern:10s} {candidate:10s} T={length}: "
                f"{seconds * 1e3:8.1f} ms (path {path}, "
                f"{visited:.0%} of block pairs)"
            )
        del steps
    write("mods", {"batch": BATCH, "rows": rows})


if __name__ == "__main__":
    main()
