"""Runs context-parallel attention on simulated CPU devices and prints
what `test_context_parallel.py` checks, as JSON.

Run as `python -m tests.unit.distribution.cp_worker CHECK BATCH SEQUENCE`
with `XLA_FLAGS=--xla_force_host_platform_device_count=8` and
`KERAS_BACKEND=jax` (the device count is fixed when JAX starts, so the
suite runs it in a subprocess). Every figure is the largest absolute
difference from the same computation on one device.
"""

import json
import sys

import jax
import keras
import numpy as np

import keras_attention
from keras_attention import mods
from keras_attention._kernels import context
from keras_attention.distribution import ContextParallel
from keras_attention.functional import scaled_dot_product_attention

B, T, N, K, H, D = 2, 32, 4, 2, 8, 16  # T: a multiple of 2 x 8 devices


def mesh_of(batch, sequence):
    devices = keras.distribution.list_devices()[: batch * sequence]
    return keras.distribution.DeviceMesh(
        (batch, sequence), ("batch", "sequence"), devices
    )


def random(shape, seed, dtype="float32"):
    return np.random.default_rng(seed).normal(size=shape).astype(dtype)


def segment_ids(length=T):
    """Three packed documents in row 0 whose borders fall inside shards
    (T / 8 = 4 rows per device), one in row 1 with padding (id 0)."""
    ids = np.zeros((B, length), "int32")
    ids[0, :7], ids[0, 7:22], ids[0, 22:] = 1, 2, 3
    ids[1, : length - 5] = 1
    return ids


def padding(length=T):
    mask = np.ones((B, length), bool)
    mask[1, 21:] = False
    return mask


def functional_cases(length):
    """The structures the functional checks take, for `length` tokens."""
    return {
        **FUNCTIONAL_CASES,
        "segments": {"segment_ids": segment_ids(length)},
        "causal_segments": {
            "is_causal": True,
            "segment_ids": segment_ids(length),
        },
        "padding": {"mask": padding(length)[:, None, None, :]},
        "prefix_lm_mod_window_segments": {
            "mask_mod": mods.prefix_lm(np.array([5, 20])),
            "sliding_window": (4, 4),
            "segment_ids": segment_ids(length),
        },
    }


FUNCTIONAL_CASES = {
    "plain": {},
    "causal": {"is_causal": True},
    "bottom_right": {"is_causal": "bottom_right"},
    "window": {"sliding_window": 5},
    "window_pair": {"sliding_window": (3, 2)},
    "segments": {"segment_ids": segment_ids()},
    "causal_segments": {"is_causal": True, "segment_ids": segment_ids()},
    "padding": {"mask": padding()[:, None, None, :]},
    "alibi": {"alibi": True, "is_causal": True},
    "soft_cap": {"logit_soft_cap": 3.0},
    "prefix_lm_mod": {"mask_mod": mods.prefix_lm(np.array([5, 20]))},
    "own_mod": {"mask_mod": lambda b, h, q, k: (q + 2 * k + h + b) % 3 != 0},
    "own_mod_causal": {
        "mask_mod": lambda b, h, q, k: (q + 2 * k + h + b) % 3 != 0,
        "is_causal": True,
    },
    "prefix_lm_mod_window_segments": {
        "mask_mod": mods.prefix_lm(np.array([5, 20])),
        "sliding_window": (4, 4),
        "segment_ids": segment_ids(),
    },
    "sinks_or_window_mod": {
        "mask_mod": mods.or_masks(mods.sink_tokens(2), mods.sliding_window(3))
    },
}


def largest_difference(a, b):
    leaves = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
               for x, y in leaves)  # fmt: skip


def on_both(fn, args, distribution):
    """`fn(*args)` on one device and under `distribution`: the largest
    difference of everything it returns, and how many attention calls
    ran context-parallel (a fresh function each time: `jax.jit` would
    reuse the first trace)."""
    alone = jax.jit(lambda *a: fn(*a))(*args)
    before = len(CALLS)
    with distribution.scope():
        shared = jax.jit(lambda *a: fn(*a))(*args)
    return [largest_difference(alone, shared), len(CALLS) - before]


CALLS = []
_attention = context.attention


def _counted(*args):
    CALLS.append(args[-1].ring)
    return _attention(*args)


context.attention = _counted


def with_gradients(fn, cotangent_seed=7):
    """`(outputs, gradients of every argument)` of `Σ c · fn(*args)`."""

    def loss(*args):
        out = fn(*args)
        return jnp_sum(out * random(out.shape, cotangent_seed)), out

    def run(*args):
        (_, out), grads = jax.value_and_grad(
            loss, argnums=tuple(range(len(args))), has_aux=True
        )(*args)
        return out, grads

    return run


def jnp_sum(x):
    return jax.numpy.sum(x)


def functional_differences(distribution, exchanges, length=T):
    """Every structure on each exchange of `exchanges` (`(name, block
    rows)`: "all_gather" or "ring", and the rows of the blocks inside a
    chunk pair), with the gradients of the query, key and value, for
    `length` tokens."""
    query = random((B, length, N, H), 0)
    key = random((B, length, K, H), 1)
    value = random((B, length, K, H), 2)
    cases = functional_cases(length)
    found = {}
    for exchange, block in exchanges:
        context.sharding.ALL_GATHER_MAX_BYTES = (
            1 << 40 if exchange == "all_gather" else 0
        )
        context.blocks.BLOCK = block
        for name, arguments in cases.items():
            fn = with_gradients(
                lambda q, k, v, a=arguments: scaled_dot_product_attention(
                    q, k, v, **a
                )
            )
            found[f"{exchange}/{name}"] = on_both(
                fn, (query, key, value), distribution
            )
        single = with_gradients(
            lambda q, k, v: scaled_dot_product_attention(
                q[:, :, 0], k[:, :, 0], v[:, :, 0], is_causal=True
            )
        )
        found[f"{exchange}/single_head_causal"] = on_both(
            single, (query, key, value), distribution
        )
    context.sharding.ALL_GATHER_MAX_BYTES, context.blocks.BLOCK = (
        EXCHANGE_DEFAULTS
    )
    return found


EXCHANGE_DEFAULTS = context.sharding.ALL_GATHER_MAX_BYTES, context.blocks.BLOCK


def rows_differences(distribution):
    """Mods of per-row data with several rows on each device (a batch of
    4 on a batch axis of 2): each device calls them on its block of the
    batch's rows, by their global indices."""
    batch = 4
    query = random((batch, T, N, H), 3)
    key, value = random((batch, T, K, H), 4), random((batch, T, K, H), 5)
    ids = np.ones((batch, T), "int32")
    ids[:, 11:], ids[3, 25:] = 2, 0
    cases = {
        "prefix_lm": mods.prefix_lm(np.array([3, 9, 0, 17])),
        "document": mods.document(ids),
    }
    return {
        name: on_both(
            with_gradients(
                lambda q, k, v, m=mod: scaled_dot_product_attention(
                    q, k, v, mask_mod=m
                )
            ),
            (query, key, value),
            distribution,
        )
        for name, mod in cases.items()
    }


def layer_cases():
    """`(name, layer, call arguments)`: every layer, with the structure
    and positions each can take."""
    mhsa = keras_attention.MultiHeadSelfAttention
    encoder = keras_attention.TransformerEncoderBlock
    decoder = keras_attention.TransformerDecoderBlock
    cross = keras_attention.CrossAttention
    return [
        ("mhsa/plain", mhsa(N, H), {}),
        ("mhsa/causal", mhsa(N, H), {"use_causal_mask": True}),
        ("mhsa/window", mhsa(N, H, sliding_window=5),
         {"use_causal_mask": True}),
        ("mhsa/segments", mhsa(N, H), {"segment_ids": segment_ids()}),
        ("mhsa/padding", mhsa(N, H), {"padding_mask": padding()}),
        ("mhsa/gqa_rotary", mhsa(N, H, num_key_value_heads=K,
                                 use_rotary=True),
         {"use_causal_mask": True}),
        ("mhsa/alibi", mhsa(N, H, alibi=True), {"use_causal_mask": True}),
        ("encoder/padding", encoder(N, 32, key_dim=H),
         {"padding_mask": padding()}),
        ("encoder/segments_rotary", encoder(N, 32, key_dim=H,
                                            use_rotary=True),
         {"segment_ids": segment_ids()}),
        ("decoder/causal_gqa", decoder(N, 32, key_dim=H,
                                       num_key_value_heads=K),
         {"padding_mask": padding()}),
        ("decoder/cross_window", decoder(N, 32, key_dim=H,
                                         sliding_window=6),
         {"encoder_outputs": random((B, T, D), 5),
          "encoder_padding_mask": padding()}),
        ("cross/padding_gqa", cross(N, H, num_key_value_heads=K),
         {"value": random((B, T, D), 6), "value_mask": padding()}),
    ]  # fmt: skip


def layer_differences(distribution, exchange):
    """Outputs and the gradients of the inputs and of every trainable
    weight, with the attention on one device and under `distribution`,
    keys and values exchanged by `exchange`."""
    context.sharding.ALL_GATHER_MAX_BYTES = (
        1 << 40 if exchange == "all_gather" else 0
    )
    found = {}
    inputs = random((B, T, D), 3)
    for name, layer, arguments in layer_cases():
        keras.utils.set_random_seed(0)
        layer(inputs, **arguments)  # builds it
        trainable = [v.value for v in layer.trainable_variables]
        fixed = [v.value for v in layer.non_trainable_variables]
        floats = {k: v for k, v in arguments.items()
                  if k in ("encoder_outputs", "value")}  # fmt: skip
        rest = {k: v for k, v in arguments.items() if k not in floats}

        def call(x, weights, extra, layer=layer, rest=rest, fixed=fixed):
            out, _ = layer.stateless_call(weights, fixed, x, **extra, **rest)
            return out

        found[name] = on_both(
            with_gradients(call), (inputs, trainable, floats), distribution
        )
    context.sharding.ALL_GATHER_MAX_BYTES = EXCHANGE_DEFAULTS[0]
    return found


def fit_differences(distribution):
    """A small decoder-only model (learned and rotary positions) fitted
    for six steps on one device and under `distribution`: the largest
    difference of the losses and of the weights after."""
    vocabulary = 11
    tokens = np.random.default_rng(4).integers(0, vocabulary, (12, T + 1))

    def fitted():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((T,), dtype="int32")
        x = keras.layers.Embedding(vocabulary, D)(inputs)
        x = keras_attention.PositionEmbedding(T)(x)  # learned positions
        x = keras_attention.TransformerDecoderBlock(
            N, 32, key_dim=H, num_key_value_heads=K, use_rotary=True
        )(x)
        model = keras.Model(inputs, keras.layers.Dense(vocabulary)(x))
        initial = [np.asarray(w) for w in model.get_weights()]
        model.compile(
            optimizer=keras.optimizers.Adam(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        history = model.fit(
            tokens[:, :-1], tokens[:, 1:], batch_size=4, epochs=2,
            shuffle=False, verbose=0,
        )  # fmt: skip
        weights = [np.asarray(w) for w in model.get_weights()]
        return history.history["loss"], weights, initial

    alone = fitted()
    before = len(CALLS)
    with distribution.scope():
        shared = fitted()
    *trained, initial = shared
    unmoved = sum(
        np.array_equal(a, b) for a, b in zip(initial, trained[1], strict=True)
    )
    return [
        largest_difference(alone[:2], trained),
        len(CALLS) - before,
        int(unmoved),
    ]


def memory(length=65536, heads=4, depth=32):
    """Per device, the bytes of a compiled training step of causal
    attention alone (forward and backward, B=1): `{P: [temporaries,
    arguments and outputs]}` for the ring on P = 1, 2, 4, 8 devices."""
    query = jax.ShapeDtypeStruct((1, length, heads, depth), "float32")
    fn = with_gradients(
        lambda q, k, v: scaled_dot_product_attention(q, k, v, is_causal=True)
    )
    context.sharding.ALL_GATHER_MAX_BYTES = 0
    found = {}
    for devices in (1, 2, 4, 8):
        with ContextParallel(mesh_of(1, devices)).scope():
            compiled = (
                jax.jit(lambda *a: fn(*a)).lower(query, query, query).compile()
            )
        analysis = compiled.memory_analysis()
        found[devices] = [
            analysis.temp_size_in_bytes,
            analysis.argument_size_in_bytes + analysis.output_size_in_bytes,
        ]
    return found


def tensor_parallel_difference():
    """`MultiHeadSelfAttention` (grouped heads, ALiBi, causal) built under
    a `(batch 1, sequence 4, model 2)` mesh whose layout map shards the
    projections' heads along "model": its outputs against one device."""
    devices = keras.distribution.list_devices()
    mesh = keras.distribution.DeviceMesh(
        (1, 4, 2), ("batch", "sequence", "model"), devices
    )
    layout_map = keras.distribution.LayoutMap(mesh)
    for name in ("query", "key", "value"):
        layout_map[f".*{name}_dense.*kernel"] = (None, "model", None)
    inputs = random((B, T, D), 3)

    def output():
        keras.utils.set_random_seed(0)
        layer = keras_attention.MultiHeadSelfAttention(
            N, H, num_key_value_heads=K, alibi=True
        )
        model = keras.Sequential([keras.Input((T, D)), layer])
        return model.predict(inputs, verbose=0)

    alone = output()
    before = len(CALLS)
    with ContextParallel(mesh, layout_map).scope():
        shared = output()
    return [largest_difference(alone, shared), len(CALLS) - before]


def refusal(distribution):
    """The error for a length that the sequence axis does not divide."""
    query = random((B, 20, N, H), 0)
    with distribution.scope():
        try:
            scaled_dot_product_attention(query, query, query)
        except ValueError as error:
            return str(error)
    return None


def balance():
    """Visited chunk pairs per device on 8 devices, from the plan: for
    causal attention in the zig-zag and the contiguous order, and for a
    causal window in the order the layout chooses and the other."""
    from keras_attention._core import Structure

    length = 8192
    mesh = ContextParallel(mesh_of(1, 8)).device_mesh.backend_mesh
    found = {}
    for name, arguments in (
        ("causal", {"is_causal": True}),
        ("window", {"is_causal": True, "sliding_window": length // 2}),
    ):
        structure = Structure.from_args(
            where="balance", query_length=length, key_length=length,
            **arguments,
        )  # fmt: skip
        shapes = {"batch": 1, "query_length": length, "key_length": length,
                  "kv_heads": 1, "head_dims": (8, 8)}  # fmt: skip
        chosen, _ = context.sharding.layout(
            structure, shapes, mesh, "batch", "sequence"
        )
        for zigzag in (True, False):
            sharding = context.Sharding(mesh, "batch", "sequence", zigzag, True)
            counts = context.visited_chunks(sharding, structure, length, length)
            order = "chosen" if zigzag == chosen.zigzag else "other"
            found[f"{name}/{order}"] = counts.tolist()
            found[f"{name}/{'zigzag' if zigzag else 'contiguous'}"] = (
                counts.tolist()
            )
    return found


MESHES = {
    # (batch, sequence): the checks run on that mesh.
    (1, 8): {
        # Blocks of 1 row inside the chunks of 2: the nested loops.
        "functional": lambda d: functional_differences(
            d, [("ring", 1)]),
        "layers": lambda d: layer_differences(d, "ring"),
        "refusal": refusal,
        "balance": lambda d: balance(),
        "memory": lambda d: memory(),
    },
    (2, 4): {
        # T = 40: chunks of 5 rows in 2 blocks of 3, the last one
        # overlapping the one before.
        "functional": lambda d: functional_differences(
            d, [("all_gather", 3)], length=40),
        "layers": lambda d: layer_differences(d, "all_gather"),
        "fit": fit_differences,
        "rows": rows_differences,
        "tensor_parallel": lambda d: tensor_parallel_difference(),
    },
}  # fmt: skip


def main():
    batch, sequence = int(sys.argv[1]), int(sys.argv[2])
    distribution = ContextParallel(mesh_of(batch, sequence))
    checks = MESHES[batch, sequence]
    print(json.dumps({name: run(distribution) for name, run in checks.items()}))


if __name__ == "__main__":
    main()
