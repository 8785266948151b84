"""The one registry of layer cases that the contract tests run over.

A case is a small, built-from-scratch instance of a public layer with the
shapes of its call inputs and what Keras's harness expects of it (output
shapes, weight and seed-generator counts). Every contract test
(`tests/contract/`) is parametrised over `CASES`, and
`test_every_public_layer_has_a_case` keeps the registry complete: a new
public layer gets its cases here, and every contract check runs on it.

Multi-input layers give `input_shape` as a dict keyed by the names of
their `build` arguments (`query_shape`, `inputs_shape`, ...), as Keras
tests `MultiHeadAttention`; the call's tensor arguments have the same
names without `_shape`. `AttentionDecoder` is given its cell and
attention as configs so that each instance gets sublayers of its own.

Shape legend: B batch, T query length, S key/value length, D model dim.
"""

import keras
import numpy as np

import keras_attention as ka

B, T, S, D = 2, 3, 5, 8


def case(layer_cls, init_kwargs, input_shape, output_shape, trainable, **kw):
    """`run_layer_test` arguments; `seed_generators` defaults to 0."""
    return {
        "layer_cls": layer_cls,
        "init_kwargs": init_kwargs,
        "input_shape": input_shape,
        "expected_output_shape": output_shape,
        "expected_num_trainable_weights": trainable,
        "expected_num_seed_generators": kw.pop("seed_generators", 0),
        **kw,
    }


SCORES = {"call_kwargs": {"return_attention_scores": True}}

CASES = {
    "bahdanau_normalized": case(
        ka.BahdanauAttention,
        {"units": 4, "normalize": True, "dropout": 0.1},
        {"query_shape": (B, T, 6), "value_shape": (B, S, D)},
        (B, T, D),
        5,  # query and key kernels, v_a, its gain and bias
        seed_generators=1,
    ),
    "luong_dot_one_step": case(
        ka.LuongAttention,
        {"score": "dot"},
        {"query_shape": (B, D), "value_shape": (B, S, D)},
        ((B, D), (B, S)),
        0,
        **SCORES,
    ),
    "luong_general_scaled_key": case(
        ka.LuongAttention,
        {"score": "general", "scale": True},
        {
            "query_shape": (B, T, 6),
            "value_shape": (B, S, D),
            "key_shape": (B, S, 4),
        },
        (B, T, D),
        2,  # W_a and the gain
    ),
    "luong_concat": case(
        ka.LuongAttention,
        {"score": "concat", "units": 4, "dropout": 0.1},
        {"query_shape": (B, T, 6), "value_shape": (B, S, D)},
        ((B, T, D), (B, T, S)),
        3,
        seed_generators=1,
        **SCORES,
    ),
    "location_sensitive": case(
        ka.LocationSensitiveAttention,
        {"units": 4, "filters": 3, "kernel_size": 3},
        {"query_shape": (B, T, 6), "value_shape": (B, S, D)},
        ((B, T, D), (B, T, S)),
        6,  # W, V, the location filters and projection, v and b
        **SCORES,
    ),
    "monotonic_noisy": case(
        ka.MonotonicAttention,
        {"units": 4, "normalize": True, "sigmoid_noise": 1.0},
        {"query_shape": (B, T, 6), "value_shape": (B, S, D)},
        (B, T, D),
        6,  # Bahdanau's score with weight norm and the offset r
        seed_generators=1,  # the score noise's
    ),
    "monotonic_luong_hard_one_step": case(
        ka.MonotonicAttention,
        {"score": "luong", "mode": "hard"},
        {"query_shape": (B, D), "value_shape": (B, S, D)},
        ((B, D), (B, S)),
        2,  # W_a and the offset r
        **SCORES,
    ),
    "decoder_gru_location_sensitive": case(
        ka.AttentionDecoder,
        {
            "cell": keras.layers.serialize(keras.layers.GRUCell(4)),
            "attention": keras.layers.serialize(
                ka.LocationSensitiveAttention(4, filters=2, kernel_size=3)
            ),
        },
        {"inputs_shape": (B, T, 6), "encoder_outputs_shape": (B, S, D)},
        (B, T, 4),
        3 + 6,
        seed_generators=1,  # the cell's
    ),
    "decoder_gru_bahdanau": case(
        ka.AttentionDecoder,
        {
            "cell": keras.layers.serialize(keras.layers.GRUCell(4)),
            "attention": keras.layers.serialize(ka.BahdanauAttention(4)),
        },
        {"inputs_shape": (B, T, 6), "encoder_outputs_shape": (B, S, D)},
        (B, T, 4),
        3 + 3,
        seed_generators=1,  # the cell's
    ),
    # GNMT's stack: the Bahdanau flow scores with the first cell's state.
    "decoder_stacked_bahdanau": case(
        ka.AttentionDecoder,
        {
            "cell": keras.layers.serialize(
                keras.layers.StackedRNNCells(
                    [keras.layers.GRUCell(3), keras.layers.LSTMCell(4)]
                )
            ),
            "attention": keras.layers.serialize(ka.BahdanauAttention(4)),
        },
        {"inputs_shape": (B, T, 6), "encoder_outputs_shape": (B, S, D)},
        (B, T, 4),
        3 + 3 + 3,  # each cell's kernels and bias, W_a, U_a, v_a
        seed_generators=2,  # the cells'
    ),
    "decoder_lstm_luong": case(
        ka.AttentionDecoder,
        {
            "cell": keras.layers.serialize(keras.layers.LSTMCell(4)),
            "attention": keras.layers.serialize(ka.LuongAttention("general")),
            "attention_dim": 5,
        },
        {"inputs_shape": (B, T, 6), "encoder_outputs_shape": (B, S, D)},
        (B, T, 5),
        3 + 1 + 1,  # the cell, W_a, W_c
        seed_generators=1,
    ),
    # tensorflow-addons' AttentionWrapper with an attention layer.
    "decoder_gru_bahdanau_linear": case(
        ka.AttentionDecoder,
        {
            "cell": keras.layers.serialize(keras.layers.GRUCell(4)),
            "attention": keras.layers.serialize(ka.BahdanauAttention(4)),
            "flow": "luong",
            "attention_dim": 5,
            "attention_activation": None,
        },
        {"inputs_shape": (B, T, 6), "encoder_outputs_shape": (B, S, D)},
        (B, T, 5),
        3 + 3 + 1,  # the cell, W_a, U_a, v_a, W_c
        seed_generators=1,
    ),
    "self_attention": case(
        ka.MultiHeadSelfAttention,
        {"num_heads": 2, "dropout": 0.1},
        (B, T, D),
        (B, T, D),
        8,  # 4 projections, kernel and bias
        seed_generators=1,
        call_kwargs={"use_causal_mask": True},
    ),
    "self_attention_relative_bias": case(
        ka.MultiHeadSelfAttention,
        {
            "num_heads": 2,
            "score_mod": keras.saving.serialize_keras_object(
                ka.RelativePositionBias(
                    num_buckets=8,
                    max_distance=4,
                    embeddings_initializer="random_normal",
                )
            ),
        },
        (B, T, D),
        (B, T, D),
        9,  # 4 projections, kernel and bias; the bias table
        call_kwargs={"use_causal_mask": True},
    ),
    "self_attention_gqa_rotary": case(
        ka.MultiHeadSelfAttention,
        {
            "num_heads": 4,
            "num_key_value_heads": 2,
            "use_rotary": True,
            "use_bias": False,
        },
        (B, T, D),
        (B, T, D),
        4,
    ),
    "cross_attention_gqa_key": case(
        ka.CrossAttention,
        {
            "num_heads": 2,
            "num_key_value_heads": 1,
            "key_dim": 3,
            "dropout": 0.1,
        },
        {
            "query_shape": (B, T, D),
            "value_shape": (B, S, 6),
            "key_shape": (B, S, 4),
        },
        ((B, T, D), (B, 2, T, S)),
        8,
        seed_generators=1,
        **SCORES,
    ),
    "positional_encoding": case(
        ka.PositionalEncoding,
        {"max_wavelength": 100.0},
        (B, T, D),
        (B, T, D),
        0,
    ),
    "position_embedding": case(
        ka.PositionEmbedding, {"max_length": S}, (B, T, D), (B, T, D), 1
    ),
    "rotary_embedding": case(
        ka.RotaryEmbedding, {}, (B, T, 2, 4), (B, T, 2, 4), 0
    ),
    "encoder_block": case(
        ka.TransformerEncoderBlock,
        {"num_heads": 2, "intermediate_dim": 16, "dropout": 0.1},
        (B, T, D),
        (B, T, D),
        8 + 4 + 4,  # attention, 2 LayerNorms, 2 Dense
        seed_generators=3,  # attention weights, 2 residual branches
    ),
    "decoder_only_block": case(
        ka.TransformerDecoderBlock,
        {
            "num_heads": 2,
            "intermediate_dim": 16,
            "normalize_first": True,
            "use_rotary": True,
            "use_bias": False,  # Llama-style: no biases, RMSNorm
            "use_rms_norm": True,
        },
        (B, T, D),
        (B, T, D),
        4 + 2 + 2,  # attention kernels, 2 RMSNorm scales, 2 Dense kernels
    ),
    "decoder_block_with_encoder": case(
        ka.TransformerDecoderBlock,
        {"num_heads": 2, "intermediate_dim": 16, "dropout": 0.1},
        {"inputs_shape": (B, T, D), "encoder_outputs_shape": (B, S, 6)},
        (B, T, D),
        8 + 4 + 4 + 8 + 2,  # and cross-attention with its LayerNorm
        seed_generators=5,
    ),
}


def make(name, **overrides):
    """A fresh, unbuilt layer of case `name` (`overrides` replace init
    arguments, `dtype` for example)."""
    arguments = CASES[name]
    return arguments["layer_cls"](**{**arguments["init_kwargs"], **overrides})


def _shapes(name):
    """`{argument: shape}` of case `name`'s tensor arguments, in order."""
    shapes = CASES[name]["input_shape"]
    if not isinstance(shapes, dict):
        shapes = {"inputs_shape": shapes}
    return {key[: -len("_shape")]: shape for key, shape in shapes.items()}


def tensors(name, seed=0):
    """Random float32 inputs of case `name`'s shapes, in call order."""
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal(shape).astype("float32")
        for shape in _shapes(name).values()
    ]


def call_inputs(name, seed=0):
    """`(args, kwargs)` of a call of case `name`: `tensors`, the first
    positional and the others by name, and the case's call arguments."""
    values = tensors(name, seed)
    kwargs = dict(zip(list(_shapes(name))[1:], values[1:], strict=True))
    return (values[0],), {**kwargs, **CASES[name].get("call_kwargs", {})}


def public_layer_classes():
    """Every public layer class of `keras_attention` (the abstract
    `AttentionMechanism` protocol aside)."""
    return {
        getattr(ka, name)
        for name in ka.__all__
        if isinstance(getattr(ka, name), type)
        and issubclass(getattr(ka, name), keras.layers.Layer)
        and getattr(ka, name) is not ka.AttentionMechanism
    }


def symbolic_inputs(name):
    """`keras.Input`s of case `name`'s shapes (unknown batch), in call
    order."""
    return [keras.Input(shape[1:]) for shape in _shapes(name).values()]


def call(name, layer, inputs):
    """The case's call of `layer` on `inputs` (in call order, tensors or
    `keras.Input`s), with its call arguments."""
    kwargs = dict(zip(list(_shapes(name))[1:], inputs[1:], strict=True))
    return layer(inputs[0], **kwargs, **CASES[name].get("call_kwargs", {}))


def outputs_of(result):
    """The first output of a call (`(outputs, scores)` gives `outputs`)."""
    return result[0] if isinstance(result, (tuple, list)) else result
