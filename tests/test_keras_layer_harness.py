"""Keras's own layer test harness, `run_layer_test`, on every public layer.

It is what Keras runs on its own layers: a config and serialization round
trip, `build` from shapes, a symbolic and an eager call with the expected
output shapes and dtype, weight and seed-generator counts (on torch also
the tracked parameters, which catches variables that share a path), a
training step (single-input layers: Keras's harness calls the layer on one
tensor) and mixed precision (not on torch CPU, where Keras skips it). Each
case also checks `compute_output_shape`, which the harness leaves to
`compute_output_spec`, unbuilt and with an unknown batch.

Multi-input layers pass `input_shape` as a dict keyed by the names of their
`build` arguments (`query_shape`, `inputs_shape`, ...), as Keras tests
`MultiHeadAttention`. `AttentionDecoder` is given its cell and attention as
configs so that each instance the harness makes gets sublayers of its own.
"""

import keras
import pytest
from absl.testing import parameterized
from keras.src import testing

import keras_attention as ka

# Keras's training step fits on a generator with the default shuffle=True.
pytestmark = pytest.mark.filterwarnings(
    "ignore:`shuffle=True` was passed:UserWarning"
)

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
    "self_attention": case(
        ka.MultiHeadSelfAttention,
        {"num_heads": 2, "dropout": 0.1},
        (B, T, D),
        (B, T, D),
        8,  # 4 projections, kernel and bias
        seed_generators=1,
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
        },
        (B, T, D),
        (B, T, D),
        8 + 4 + 4,
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


def _unknown_batch(shape):
    return (None, *shape[1:])


class KerasLayerHarnessTest(testing.TestCase):
    @parameterized.named_parameters(CASES.items())
    def test_run_layer_test(self, arguments):
        input_shape = arguments["input_shape"]
        expected_shape = arguments["expected_output_shape"]
        multi_input = isinstance(input_shape, dict)
        trainable = arguments["expected_num_trainable_weights"]
        self.run_layer_test(
            **arguments,
            expected_output_dtype=keras.tree.map_shape_structure(
                lambda _: "float32", expected_shape
            ),
            expected_num_non_trainable_weights=0,
            expected_num_losses=0,
            supports_masking=True,
            # Keras's training step calls the layer on one tensor, and warns
            # (an error here) when there is nothing to train.
            run_training_check=not multi_input and trainable > 0,
        )
        if isinstance(expected_shape[0], tuple):  # (outputs, scores)
            expected_shape = expected_shape[0]
        layer = arguments["layer_cls"](**arguments["init_kwargs"])
        if multi_input:
            shapes = {k: _unknown_batch(v) for k, v in input_shape.items()}
            got = layer.compute_output_shape(**shapes)
        else:
            got = layer.compute_output_shape(_unknown_batch(input_shape))
        self.assertEqual(tuple(got), _unknown_batch(expected_shape))
