"""Bad input, enumerated per layer: every case is a `ValueError` that names
the layer (or function), the argument and what was received.

Wrong ranks, mismatched batch, length or feature dims, masks of the wrong
shape or dtype, zero/negative/non-integer sizes, out-of-range rates and
unknown options; the attention structure (windows, segment ids, soft caps,
ALiBi, alignments) and explicit positions. No case may surface as a
backend error or a NaN.
"""

import re

import keras
import numpy as np
import pytest

import keras_attention as ka
from keras_attention import decoding
from keras_attention import mods
from keras_attention.functional import causal_mask
from keras_attention.functional import explain
from keras_attention.functional import padding_to_attention_mask
from keras_attention.functional import scaled_dot_product_attention
from keras_attention.functional import segment_positions
from keras_attention.functional import structure_mask
from keras_attention.visualization import plot_attention

B, T, S, D = 2, 3, 4, 8


def x(*shape):
    return np.ones(shape, "float32")


def mask(*shape, dtype="bool"):
    return np.ones(shape, dtype)


def ids(*shape, dtype="int32"):
    return np.ones(shape, dtype)


def gru_decoder(**kwargs):
    return ka.AttentionDecoder(
        keras.layers.GRUCell(D), ka.BahdanauAttention(4), **kwargs
    )


def step_fn(ids, state):
    return keras.ops.one_hot(ids, 5), state


def decode(function, start_ids, **kwargs):
    """`decoding.<function>` of `step_fn`, 3 tokens (2 beams)."""
    if function == "beam_search":
        kwargs["beam_width"] = 2
    return getattr(decoding, function)(step_fn, (), start_ids, 3, **kwargs)


SDPA = "scaled_dot_product_attention"
MHSA, CROSS = "MultiHeadSelfAttention", "CrossAttention"
ENC, DEC = "TransformerEncoderBlock", "TransformerDecoderBlock"


def sdpa(q, k, v, m=None):
    return lambda: scaled_dot_product_attention(q, k, v, m)


def structured(**structure):
    """`scaled_dot_product_attention` of T queries over S keys with the
    given structural arguments."""
    return lambda: scaled_dot_product_attention(
        x(B, T, D), x(B, S, D), x(B, S, D), **structure
    )


def explained(**structure):
    return lambda: explain(x(B, T, D), x(B, S, D), **structure)


def cached_cross(source_length, where):
    """A call with a cross-attention cache of S source positions and a
    source of `source_length` given along with it (to the
    `CrossAttention` layer itself, or to a decoder block)."""

    def call():
        if where == CROSS:
            layer = ka.CrossAttention(2)
            layer.build((B, 1, D), (B, S, D))
            cache = layer.compute_cache(x(B, S, D))
            return layer(x(B, 1, D), x(B, source_length, D), cache=cache)
        block = ka.TransformerDecoderBlock(2, 16)
        block(x(B, 2, D), x(B, S, D))
        cache = block.init_cache(B, 4, encoder_outputs=x(B, S, D))
        return block(
            x(B, 1, D), x(B, source_length, D), cache=cache, cache_index=0
        )

    return call


def built_mhsa():
    layer = ka.MultiHeadSelfAttention(2)
    layer.build((B, T, D))
    return layer


# (who, argument named after "Received:", the call that must raise)
CASES = {
    # scaled_dot_product_attention
    "sdpa-rank-2": (SDPA, "query", sdpa(x(B, D), x(B, D), x(B, D))),
    "sdpa-rank-mixed": (
        SDPA,
        "key",
        sdpa(x(B, T, D), x(B, S, 2, D), x(B, S, D)),
    ),
    "sdpa-batch": (SDPA, "key", sdpa(x(B, T, D), x(3, S, D), x(3, S, D))),
    "sdpa-length": (SDPA, "value", sdpa(x(B, T, D), x(B, S, D), x(B, 5, D))),
    "sdpa-features": (SDPA, "key", sdpa(x(B, T, D), x(B, S, 4), x(B, S, D))),
    "sdpa-heads": (
        SDPA,
        "query",
        sdpa(x(B, T, 3, D), x(B, S, 2, D), x(B, S, 2, D)),
    ),
    "sdpa-mask-shape": (
        SDPA,
        "mask",
        sdpa(x(B, T, D), x(B, S, D), x(B, S, D), mask(B, T, 5)),
    ),
    "sdpa-mask-rank": (
        SDPA,
        "mask",
        sdpa(x(B, T, D), x(B, S, D), x(B, S, D), mask(S)),
    ),
    "sdpa-mask-float": (
        SDPA,
        "mask",
        sdpa(
            x(B, T, D), x(B, S, D), x(B, S, D), mask(B, T, S, dtype="float32")
        ),
    ),
    "sdpa-integer-query": (
        SDPA,
        "query.dtype=int32",
        sdpa(ids(B, T, D), x(B, S, D), x(B, S, D)),
    ),
    "sdpa-head-dim-0": (
        SDPA,
        "query",
        sdpa(x(B, T, 0), x(B, S, 0), x(B, S, D)),
    ),
    "sdpa-scores-flag": (
        SDPA,
        "return_attention_scores",
        lambda: scaled_dot_product_attention(
            x(B, T, D), x(B, S, D), x(B, S, D), return_attention_scores="no"
        ),
    ),
    **{
        f"sdpa-scale-{name}": (
            SDPA,
            "scale",
            lambda scale=scale: scaled_dot_product_attention(
                x(B, T, D), x(B, S, D), x(B, S, D), scale=scale
            ),
        )
        for name, scale in (
            ("nan", float("nan")),
            ("inf", np.inf),
            ("str", "a"),
        )
    },
    # BahdanauAttention
    "bahdanau-units-0": (
        "BahdanauAttention",
        "units",
        lambda: ka.BahdanauAttention(0),
    ),
    "bahdanau-units-neg": (
        "BahdanauAttention",
        "units",
        lambda: ka.BahdanauAttention(-3),
    ),
    "bahdanau-units-float": (
        "BahdanauAttention",
        "units",
        lambda: ka.BahdanauAttention(2.5),
    ),
    "bahdanau-dropout": (
        "BahdanauAttention",
        "dropout",
        lambda: ka.BahdanauAttention(4, dropout=1.0),
    ),
    "bahdanau-dropout-string": (
        "BahdanauAttention",
        "dropout='0.1'",
        lambda: ka.BahdanauAttention(4, dropout="0.1"),
    ),
    "monotonic-dropout-none": (
        "MonotonicAttention",
        "dropout=None",
        lambda: ka.MonotonicAttention(4, dropout=None),
    ),
    "bahdanau-query-rank": (
        "BahdanauAttention",
        "query",
        lambda: ka.BahdanauAttention(4)(x(B, T, 1, D), x(B, S, D)),
    ),
    "bahdanau-value-rank": (
        "BahdanauAttention",
        "value",
        lambda: ka.BahdanauAttention(4)(x(B, D), x(B, D)),
    ),
    "bahdanau-batch": (
        "BahdanauAttention",
        "query",
        lambda: ka.BahdanauAttention(4)(x(3, D), x(B, S, D)),
    ),
    "bahdanau-key-length": (
        "BahdanauAttention",
        "key",
        lambda: ka.BahdanauAttention(4)(x(B, D), x(B, S, D), key=x(B, 5, D)),
    ),
    "bahdanau-mask-shape": (
        "BahdanauAttention",
        "value_mask",
        lambda: ka.BahdanauAttention(4)(
            x(B, D), x(B, S, D), value_mask=mask(B, 5)
        ),
    ),
    "bahdanau-mask-float": (
        "BahdanauAttention",
        "value_mask",
        lambda: ka.BahdanauAttention(4)(
            x(B, D), x(B, S, D), value_mask=mask(B, S, dtype="float32")
        ),
    ),
    # LuongAttention
    "luong-score": (
        "LuongAttention",
        "score",
        lambda: ka.LuongAttention("cosine"),
    ),
    "luong-concat-units": (
        "LuongAttention",
        "units",
        lambda: ka.LuongAttention("concat"),
    ),
    "luong-units-unused": (
        "LuongAttention",
        "units",
        lambda: ka.LuongAttention("dot", units=4),
    ),
    "luong-dropout": (
        "LuongAttention",
        "dropout",
        lambda: ka.LuongAttention(dropout=-0.1),
    ),
    "luong-dot-dims": (
        "LuongAttention",
        "query.shape[-1]",
        lambda: ka.LuongAttention("dot")(x(B, 4), x(B, S, D)),
    ),
    "luong-value-rank": (
        "LuongAttention",
        "value",
        lambda: ka.LuongAttention()(x(B, D), x(B, S, 1, D)),
    ),
    "luong-mask-shape": (
        "LuongAttention",
        "value_mask",
        lambda: ka.LuongAttention()(x(B, D), x(B, S, D), value_mask=mask(S)),
    ),
    # LocationSensitiveAttention
    **{
        f"location-{i}-{argument}": (
            "LocationSensitiveAttention",
            argument,
            make,
        )
        for i, (argument, make) in enumerate(
            (
                ("units", lambda: ka.LocationSensitiveAttention(0)),
                (
                    "filters",
                    lambda: ka.LocationSensitiveAttention(4, filters=-1),
                ),
                ("kernel_size", lambda: ka.LocationSensitiveAttention(4, 8, 0)),
                (
                    "kernel_size",
                    lambda: ka.LocationSensitiveAttention(4, kernel_size=2.5),
                ),
                (
                    "cumulative",
                    lambda: ka.LocationSensitiveAttention(4, cumulative="yes"),
                ),
                (
                    "smoothing",
                    lambda: ka.LocationSensitiveAttention(4, smoothing=None),
                ),
                (
                    "dropout",
                    lambda: ka.LocationSensitiveAttention(4, dropout=1),
                ),
            )
        )
    },
    "location-state-keys": (
        "LocationSensitiveAttention",
        "attention_state",
        lambda: ka.LocationSensitiveAttention(4)(
            x(B, D), x(B, S, D), attention_state={"alignment": x(B, S)}
        ),
    ),
    "location-state-shape": (
        "LocationSensitiveAttention",
        "attention_state['alignment']",
        lambda: ka.LocationSensitiveAttention(4, cumulative=False)(
            x(B, T, D), x(B, S, D), attention_state={"alignment": x(B, 5)}
        ),
    ),
    "location-attend-sequence": (
        "LocationSensitiveAttention",
        "query",
        lambda: ka.LocationSensitiveAttention(4).attend(
            x(B, T, D), x(B, S, D), x(B, S, 4)
        ),
    ),
    "location-mask-shape": (
        "LocationSensitiveAttention",
        "value_mask",
        lambda: ka.LocationSensitiveAttention(4)(
            x(B, T, D), x(B, S, D), value_mask=mask(B, 5)
        ),
    ),
    # MonotonicAttention
    **{
        f"monotonic-{name}": ("MonotonicAttention", argument, make)
        for name, argument, make in (
            ("mode", "mode", lambda: ka.MonotonicAttention(4, mode="soft")),
            ("score", "score", lambda: ka.MonotonicAttention(4, "dot")),
            (
                "inference-mode",
                "inference_mode",
                lambda: ka.MonotonicAttention(4, inference_mode="argmax"),
            ),
            ("units", "units", lambda: ka.MonotonicAttention()),
            (
                "luong-units",
                "units",
                lambda: ka.MonotonicAttention(4, "luong")(x(B, D), x(B, S, D)),
            ),
            (
                "normalize-luong",
                "normalize",
                lambda: ka.MonotonicAttention(score="luong", normalize=True),
            ),
            (
                "scale-bahdanau",
                "scale",
                lambda: ka.MonotonicAttention(4, scale=True),
            ),
            (
                "noise-negative",
                "sigmoid_noise",
                lambda: ka.MonotonicAttention(4, sigmoid_noise=-1.0),
            ),
            (
                "noise-nan",
                "sigmoid_noise",
                lambda: ka.MonotonicAttention(4, sigmoid_noise=float("nan")),
            ),
            (
                "bias-init",
                "score_bias_init",
                lambda: ka.MonotonicAttention(4, score_bias_init="-1"),
            ),
            (
                "state-type",
                "attention_state",
                lambda: ka.MonotonicAttention(4)(
                    x(B, D), x(B, S, D), attention_state=x(B, S)
                ),
            ),
            (
                "state-shape",
                "attention_state['alignment']",
                lambda: ka.MonotonicAttention(4)(
                    x(B, D), x(B, S, D), attention_state={"alignment": x(S)}
                ),
            ),
        )
    },
    "monotonic-attention-mode": (
        "monotonic_attention",
        "mode",
        lambda: ka.functional.monotonic_attention(x(B, S), x(B, S), "soft"),
    ),
    "monotonic-attention-int": (
        "monotonic_attention",
        "p_choose",
        lambda: ka.functional.monotonic_attention(ids(B, S), x(B, S)),
    ),
    "bahdanau-has-no-state": (
        "BahdanauAttention",
        "attention_state",
        lambda: ka.BahdanauAttention(4)(
            x(B, D), x(B, S, D), attention_state={"alignment": x(B, S)}
        ),
    ),
    "bahdanau-normalize-string": (
        "BahdanauAttention",
        "normalize='no'",
        lambda: ka.BahdanauAttention(4, normalize="no"),
    ),
    "luong-scale-string": (
        "LuongAttention",
        "scale='no'",
        lambda: ka.LuongAttention(scale="no"),
    ),
    "mechanism-query-dim-after-build": (
        "BahdanauAttention",
        "query.shape=(2, 5)",
        lambda: built(ka.BahdanauAttention(4), x(B, D), x(B, S, D))(
            x(B, 5), x(B, S, D)
        ),
    ),
    "mechanism-key-dim-after-build": (
        "LuongAttention",
        "key.shape=(2, 4, 5)",
        lambda: built(ka.LuongAttention(), x(B, D), x(B, S, D))(
            x(B, D), x(B, S, D), key=x(B, S, 5)
        ),
    ),
    "mechanism-attend-query-dim": (
        "BahdanauAttention",
        "query.shape=(2, 5)",
        lambda: built(ka.BahdanauAttention(4), x(B, D), x(B, S, D)).attend(
            x(B, 5), x(B, S, D), x(B, S, 4)
        ),
    ),
    "mechanism-mask-string": (
        "BahdanauAttention",
        "value_mask='all'",
        lambda: ka.BahdanauAttention(4)(x(B, D), x(B, S, D), value_mask="all"),
    ),
    # AttentionDecoder
    "decoder-unbuilt-initial-state": (
        "AttentionDecoder",
        "an unbuilt decoder",
        lambda: gru_decoder().get_initial_state(x(B, S, D)),
    ),
    "decoder-step-mask": (
        "AttentionDecoder",
        "encoder_padding_mask.shape=(2, 3)",
        lambda: decoder_step(lambda state: state, padding=mask(B, 3))(),
    ),
    "decoder-cell": (
        "AttentionDecoder",
        "cell",
        lambda: ka.AttentionDecoder(
            keras.layers.Dense(4), ka.BahdanauAttention(4)
        ),
    ),
    "decoder-attention": (
        "AttentionDecoder",
        "attention",
        lambda: ka.AttentionDecoder(
            keras.layers.GRUCell(4), keras.layers.Attention()
        ),
    ),
    "decoder-flow": (
        "AttentionDecoder",
        "flow",
        lambda: gru_decoder(flow="mixed"),
    ),
    "decoder-attention-dim": (
        "AttentionDecoder",
        "attention_dim",
        lambda: gru_decoder(attention_dim=0),
    ),
    "decoder-attention-activation": (
        "AttentionDecoder",
        "attention_activation",
        lambda: gru_decoder(flow="luong", attention_activation="squash"),
    ),
    "decoder-input-feeding": (
        "AttentionDecoder",
        "input_feeding='no'",
        lambda: gru_decoder(flow="luong", input_feeding="no"),
    ),
    "decoder-scores-flag": (
        "AttentionDecoder",
        "return_attention_scores='yes'",
        lambda: gru_decoder()(
            x(B, T, D), x(B, S, D), return_attention_scores="yes"
        ),
    ),
    "decoder-cell-dropout": (
        "AttentionDecoder",
        "cell.dropout",
        lambda: ka.AttentionDecoder(
            keras.layers.GRUCell(4, dropout=0.2), ka.BahdanauAttention(4)
        ),
    ),
    "decoder-inputs-rank": (
        "AttentionDecoder",
        "inputs",
        lambda: gru_decoder()(x(B, D), x(B, S, D)),
    ),
    "decoder-encoder-rank": (
        "AttentionDecoder",
        "encoder_outputs",
        lambda: gru_decoder()(x(B, T, D), x(B, D)),
    ),
    "decoder-batch": (
        "AttentionDecoder",
        "encoder_outputs",
        lambda: gru_decoder()(x(B, T, D), x(3, S, D)),
    ),
    "decoder-mask-shape": (
        "AttentionDecoder",
        "encoder_padding_mask",
        lambda: gru_decoder()(
            x(B, T, D), x(B, S, D), encoder_padding_mask=mask(B, 5)
        ),
    ),
    "decoder-mask-float": (
        "AttentionDecoder",
        "encoder_padding_mask",
        lambda: gru_decoder()(
            x(B, T, D),
            x(B, S, D),
            encoder_padding_mask=mask(B, S, dtype="float32"),
        ),
    ),
    "decoder-initial-state": (
        "AttentionDecoder",
        "initial_state",
        lambda: gru_decoder()(x(B, T, D), x(B, S, D), initial_state=[x(B, 3)]),
    ),
    # MultiHeadSelfAttention
    "mhsa-heads-0": (MHSA, "num_heads", lambda: ka.MultiHeadSelfAttention(0)),
    "mhsa-dropout-string": (
        MHSA,
        "dropout='0.1'",
        lambda: ka.MultiHeadSelfAttention(2, dropout="0.1"),
    ),
    "encoder-dropout-nan": (
        ENC,
        "dropout=nan",
        lambda: ka.TransformerEncoderBlock(2, 8, dropout=float("nan")),
    ),
    **{
        f"{who}-{name}-string": (
            who,
            f"{name}='False'",
            lambda make=make, name=name: make(**{name: "False"}),
        )
        for who, make, names in (
            (
                MHSA,
                lambda **kw: ka.MultiHeadSelfAttention(2, **kw),
                ("use_bias", "use_rotary", "use_qk_norm", "alibi"),
            ),
            (CROSS, lambda **kw: ka.CrossAttention(2, **kw), ("use_bias",)),
            *(
                (
                    block.__name__,
                    lambda block=block, **kw: block(2, 8, **kw),
                    ("normalize_first", "use_rotary", "use_bias"),
                )
                for block in (
                    ka.TransformerEncoderBlock,
                    ka.TransformerDecoderBlock,
                )
            ),
        )
        for name in names
    },
    **{
        f"{who}-return-attention-scores-string": (
            who,
            "return_attention_scores='no'",
            call,
        )
        for who, call in (
            (
                MHSA,
                lambda: ka.MultiHeadSelfAttention(2)(
                    x(B, T, D), return_attention_scores="no"
                ),
            ),
            (
                CROSS,
                lambda: ka.CrossAttention(2)(
                    x(B, T, D), x(B, S, D), return_attention_scores="no"
                ),
            ),
            (
                ENC,
                lambda: ka.TransformerEncoderBlock(2, 8)(
                    x(B, T, D), return_attention_scores="no"
                ),
            ),
            (
                DEC,
                lambda: ka.TransformerDecoderBlock(2, 8)(
                    x(B, T, D), return_attention_scores="no"
                ),
            ),
        )
    },
    **{
        f"{who}-max-wavelength-{name}": (
            who,
            f"max_wavelength={value!r}",
            lambda make=make, value=value: make(max_wavelength=value),
        )
        for who, make in (
            (MHSA, lambda **kw: ka.MultiHeadSelfAttention(2, **kw)),
            (ENC, lambda **kw: ka.TransformerEncoderBlock(2, 8, **kw)),
            (DEC, lambda **kw: ka.TransformerDecoderBlock(2, 8, **kw)),
            ("RotaryEmbedding", ka.RotaryEmbedding),
            ("PositionalEncoding", ka.PositionalEncoding),
        )
        for name, value in (
            ("string", "1e4"),
            ("negative", -1.0),
            ("nan", None),
        )
    },
    "encoder-epsilon-none": (
        ENC,
        "layer_norm_epsilon=None",
        lambda: ka.TransformerEncoderBlock(2, 8, layer_norm_epsilon=None),
    ),
    "encoder-divisible": (
        ENC,
        "inputs.shape=(2, 3, 8)",
        lambda: ka.TransformerEncoderBlock(3, 8)(x(B, T, D)),
    ),
    "decoder-odd-rotary-head": (
        DEC,
        "key_dim=3",
        lambda: ka.TransformerDecoderBlock(2, 8, key_dim=3, use_rotary=True)(
            x(B, T, D)
        ),
    ),
    "mhsa-heads-float": (
        MHSA,
        "num_heads",
        lambda: ka.MultiHeadSelfAttention(2.0),
    ),
    "mhsa-key-dim": (
        MHSA,
        "key_dim",
        lambda: ka.MultiHeadSelfAttention(2, key_dim=-4),
    ),
    "mhsa-value-dim": (
        MHSA,
        "value_dim",
        lambda: ka.MultiHeadSelfAttention(2, value_dim=0),
    ),
    "mhsa-kv-heads": (
        MHSA,
        "num_key_value_heads",
        lambda: ka.MultiHeadSelfAttention(4, num_key_value_heads=3),
    ),
    "mhsa-dropout": (
        MHSA,
        "dropout",
        lambda: ka.MultiHeadSelfAttention(2, dropout=1.5),
    ),
    "mhsa-rank": (
        MHSA,
        "inputs",
        lambda: ka.MultiHeadSelfAttention(2)(x(B, D)),
    ),
    "mhsa-divisible": (
        MHSA,
        "inputs",
        lambda: ka.MultiHeadSelfAttention(3)(x(B, T, D)),
    ),
    "mhsa-rotary-odd": (
        MHSA,
        "key_dim",
        lambda: ka.MultiHeadSelfAttention(2, 3, use_rotary=True)(x(B, T, D)),
    ),
    "mhsa-padding-shape": (
        MHSA,
        "padding_mask",
        lambda: ka.MultiHeadSelfAttention(2)(
            x(B, T, D), padding_mask=mask(B, 5)
        ),
    ),
    "mhsa-padding-float": (
        MHSA,
        "padding_mask",
        lambda: ka.MultiHeadSelfAttention(2)(
            x(B, T, D), padding_mask=mask(B, T, dtype="float32")
        ),
    ),
    "mhsa-attention-mask-shape": (
        MHSA,
        "attention_mask",
        lambda: ka.MultiHeadSelfAttention(2)(
            x(B, T, D), attention_mask=mask(B, T, 5)
        ),
    ),
    "mhsa-attention-mask-per-head": (
        MHSA,
        "attention_mask",
        lambda: ka.MultiHeadSelfAttention(2)(
            x(B, T, D), attention_mask=mask(B, 2, T, T)
        ),
    ),
    "mhsa-attention-mask-one-axis": (
        MHSA,
        "attention_mask",
        lambda: ka.MultiHeadSelfAttention(2)(
            x(B, T, D), attention_mask=mask(T)
        ),
    ),
    "mhsa-attention-mask-cache": (
        MHSA,
        "attention_mask",
        lambda: ka.MultiHeadSelfAttention(2)(
            x(B, 1, D),
            cache=x(B, 2, 4, 2, 4),
            cache_index=0,
            attention_mask=mask(1, 5),
        ),
    ),
    "mhsa-cache-index": (
        MHSA,
        "cache_index",
        lambda: ka.MultiHeadSelfAttention(2)(
            x(B, 1, D), cache=x(B, 2, 4, 2, 4)
        ),
    ),
    "mhsa-cache-overflow": (
        MHSA,
        "cache_index",
        lambda: ka.MultiHeadSelfAttention(2)(
            x(B, 1, D), cache=x(B, 2, 4, 2, 4), cache_index=4
        ),
    ),
    # CrossAttention
    "cross-heads": (CROSS, "num_heads", lambda: ka.CrossAttention(-1)),
    "cross-query-rank": (
        CROSS,
        "query",
        lambda: ka.CrossAttention(2)(x(B, D), x(B, S, D)),
    ),
    "cross-value-rank": (
        CROSS,
        "value",
        lambda: ka.CrossAttention(2)(x(B, T, D), x(B, D)),
    ),
    "cross-batch": (
        CROSS,
        "value",
        lambda: ka.CrossAttention(2)(x(B, T, D), x(3, S, D)),
    ),
    "cross-key-length": (
        CROSS,
        "key",
        lambda: ka.CrossAttention(2)(x(B, T, D), x(B, S, D), key=x(B, 5, D)),
    ),
    "cross-mask-shape": (
        CROSS,
        "value_mask",
        lambda: ka.CrossAttention(2)(
            x(B, T, D), x(B, S, D), value_mask=mask(B, T)
        ),
    ),
    "cross-mask-float": (
        CROSS,
        "value_mask",
        lambda: ka.CrossAttention(2)(
            x(B, T, D), x(B, S, D), value_mask=mask(B, S, dtype="float32")
        ),
    ),
    "cross-attention-mask-transposed": (
        CROSS,
        "attention_mask",
        lambda: ka.CrossAttention(2)(
            x(B, T, D), x(B, S, D), attention_mask=mask(S, T)
        ),
    ),
    "cross-attention-mask-float": (
        CROSS,
        "attention_mask",
        lambda: ka.CrossAttention(2)(
            x(B, T, D), x(B, S, D), attention_mask=mask(T, S, dtype="float32")
        ),
    ),
    "cross-cache-source-length": (CROSS, "value", cached_cross(5, CROSS)),
    "decoder-block-cross-cache-source-length": (
        DEC,
        "encoder_outputs",
        cached_cross(5, DEC),
    ),
    # Positions
    "sinusoidal-wavelength": (
        "PositionalEncoding",
        "max_wavelength",
        lambda: ka.PositionalEncoding(max_wavelength=0),
    ),
    "sinusoidal-rank": (
        "PositionalEncoding",
        "inputs",
        lambda: ka.PositionalEncoding()(x(B, T)),
    ),
    "sinusoidal-start": (
        "PositionalEncoding",
        "start_index",
        lambda: ka.PositionalEncoding()(x(B, T, D), start_index=-1),
    ),
    "learned-length": (
        "PositionEmbedding",
        "max_length",
        lambda: ka.PositionEmbedding(0),
    ),
    "learned-rank": (
        "PositionEmbedding",
        "inputs",
        lambda: ka.PositionEmbedding(4)(x(B, 4)),
    ),
    "learned-overflow": (
        "PositionEmbedding",
        "start_index",
        lambda: ka.PositionEmbedding(4)(x(B, T, D), start_index=2),
    ),
    "rotary-wavelength": (
        "RotaryEmbedding",
        "max_wavelength",
        lambda: ka.RotaryEmbedding(max_wavelength=-1.0),
    ),
    "rotary-odd": (
        "RotaryEmbedding",
        "inputs",
        lambda: ka.RotaryEmbedding()(x(B, T, 5)),
    ),
    "rotary-rank": (
        "RotaryEmbedding",
        "inputs",
        lambda: ka.RotaryEmbedding()(x(B, D)),
    ),
    # TransformerEncoderBlock
    "encoder-heads": (
        ENC,
        "num_heads",
        lambda: ka.TransformerEncoderBlock(0, 16),
    ),
    "encoder-intermediate": (
        ENC,
        "intermediate_dim",
        lambda: ka.TransformerEncoderBlock(2, -16),
    ),
    "encoder-dropout": (
        ENC,
        "dropout",
        lambda: ka.TransformerEncoderBlock(2, 16, dropout=1),
    ),
    "encoder-epsilon": (
        ENC,
        "layer_norm_epsilon",
        lambda: ka.TransformerEncoderBlock(2, 16, layer_norm_epsilon=0),
    ),
    "encoder-use-bias": (
        ENC,
        "use_bias",
        lambda: ka.TransformerEncoderBlock(2, 16, use_bias="no"),
    ),
    "encoder-rank": (
        ENC,
        "inputs",
        lambda: ka.TransformerEncoderBlock(2, 16)(x(B, D)),
    ),
    "encoder-attention-mask-batch": (
        ENC,
        "attention_mask",
        lambda: ka.TransformerEncoderBlock(2, 16)(
            x(B, T, D), attention_mask=mask(3, T, T)
        ),
    ),
    "encoder-padding-shape": (
        ENC,
        "padding_mask",
        lambda: ka.TransformerEncoderBlock(2, 16)(
            x(B, T, D), padding_mask=mask(T)
        ),
    ),
    # TransformerDecoderBlock
    "decoder-block-intermediate": (
        DEC,
        "intermediate_dim",
        lambda: ka.TransformerDecoderBlock(2, 0),
    ),
    "decoder-block-rms-norm": (
        DEC,
        "use_rms_norm",
        lambda: ka.TransformerDecoderBlock(2, 16, use_rms_norm=None),
    ),
    "decoder-block-rank": (
        DEC,
        "inputs",
        lambda: ka.TransformerDecoderBlock(2, 16)(x(B, D)),
    ),
    "decoder-block-encoder-rank": (
        DEC,
        "encoder_outputs",
        lambda: ka.TransformerDecoderBlock(2, 16)(x(B, T, D), x(B, D)),
    ),
    "decoder-block-batch": (
        DEC,
        "encoder_outputs",
        lambda: ka.TransformerDecoderBlock(2, 16)(x(B, T, D), x(3, S, D)),
    ),
    "decoder-block-encoder-mask": (
        DEC,
        "encoder_padding_mask",
        lambda: ka.TransformerDecoderBlock(2, 16)(
            x(B, T, D), encoder_padding_mask=mask(B, S)
        ),
    ),
    "decoder-block-encoder-mask-shape": (
        DEC,
        "encoder_padding_mask",
        lambda: ka.TransformerDecoderBlock(2, 16)(
            x(B, T, D), x(B, S, D), encoder_padding_mask=mask(B, T + S)
        ),
    ),
    "decoder-block-encoder-attention-mask": (
        DEC,
        "encoder_attention_mask",
        lambda: ka.TransformerDecoderBlock(2, 16)(
            x(B, T, D), encoder_attention_mask=mask(B, T, S)
        ),
    ),
    "decoder-block-encoder-attention-mask-shape": (
        DEC,
        "encoder_attention_mask",
        lambda: ka.TransformerDecoderBlock(2, 16)(
            x(B, T, D), x(B, S, D), encoder_attention_mask=mask(B, S, T)
        ),
    ),
    # Decoding and plots
    "beam-width": (
        "beam_search",
        "beam_width",
        lambda: decoding.beam_search(step_fn, (), np.zeros(B, "int32"), 3, 0),
    ),
    "max-length": (
        "greedy_search",
        "max_length",
        lambda: decoding.greedy_search(step_fn, (), np.zeros(B, "int32"), 0),
    ),
    "temperature": (
        "sample",
        "temperature",
        lambda: decoding.sample(
            step_fn, (), np.zeros(B, "int32"), 3, temperature=0
        ),
    ),
    "top-k": (
        "sample",
        "top_k",
        lambda: decoding.sample(step_fn, (), np.zeros(B, "int32"), 3, top_k=0),
    ),
    "top-p": (
        "sample",
        "top_p",
        lambda: decoding.sample(
            step_fn, (), np.zeros(B, "int32"), 3, top_p=1.5
        ),
    ),
    **{
        f"{function}-start-ids-{name}": (
            function,
            "start_ids",
            lambda function=function, start=start: decode(function, start),
        )
        for function in ("greedy_search", "sample")
        for name, start in (
            ("scalar", np.int32(0)),
            ("matrix", np.zeros((1, 2), "int32")),
            ("empty", np.zeros(0, "int32")),
            ("float", np.array([0.7, 2.9])),
            ("negative", np.array([-1, 0])),
        )
    },
    "beam-start-ids-matrix": (
        "beam_search",
        "start_ids",
        lambda: decoding.beam_search(
            step_fn, (), np.zeros((1, 2), "int32"), 3, 2
        ),
    ),
    **{
        f"{function}-end-id-{name}": (
            function,
            "end_id",
            lambda function=function, end=end: decode(
                function, np.zeros(B, "int32"), end_id=end
            ),
        )
        for function in ("greedy_search", "sample", "beam_search")
        for name, end in (
            ("float", 2.5),
            ("string", "</s>"),
            ("vector", np.array([3, 4])),
            ("negative", -1),
            ("bool", True),
            ("beyond-vocabulary", 5),
        )
    },
    "greedy-logits-rows": (
        "greedy_search",
        "logits.shape=(1, 5)",
        lambda: decoding.greedy_search(
            lambda ids, state: (keras.ops.zeros((1, 5)), state),
            (),
            np.zeros(B, "int32"),
            3,
        ),
    ),
    "sample-logits-rows": (
        "sample",
        "logits.shape=(1, 5)",
        lambda: decoding.sample(
            lambda ids, state: (keras.ops.zeros((1, 5)), state),
            (),
            np.zeros(B, "int32"),
            3,
            jit_compile=True,
        ),
    ),
    "beam-coverage-attention-shape": (
        "beam_search",
        "attention.shape=(2, 4)",
        lambda: decoding.beam_search(
            lambda ids, state: (
                keras.ops.one_hot(ids, 5),
                state,
                keras.ops.ones((B, S)),
            ),
            (),
            np.zeros(B, "int32"),
            3,
            2,
            coverage_penalty=0.2,
        ),
    ),
    "plot-weights": (
        "plot_attention",
        "weights",
        lambda: plot_attention(x(3), ["a"], ["b"]),
    ),
    "plot-empty": (
        "plot_attention",
        "weights",
        lambda: plot_attention(x(0, 4)),
    ),
    "plot-strings": (
        "plot_attention",
        "string to float",
        lambda: plot_attention([["a", "b"]]),
    ),
    **{
        f"causal-mask-{name}": (
            "causal_mask",
            "query_length",
            lambda length=length: causal_mask(length, 3),
        )
        for name, length in (("float", 2.5), ("none", None), ("negative", -1))
    },
    "padding-to-attention-float": (
        "padding_to_attention_mask",
        "padding_mask",
        lambda: padding_to_attention_mask(np.array([[0.5, 0.0]])),
    ),
    "padding-to-attention-rank": (
        "padding_to_attention_mask",
        "padding_mask",
        lambda: padding_to_attention_mask(mask(B, T, S)),
    ),
    "padding-to-attention-length": (
        "padding_to_attention_mask",
        "query_length",
        lambda: padding_to_attention_mask(mask(B, S), -1),
    ),
    "plot-tokens": (
        "plot_attention",
        "source_tokens",
        lambda: plot_attention(x(2, 3), ["a", "b"], ["x", "y"]),
    ),
}


# The structural arguments, each bad value on everything that takes it:
# (case suffix, argument, value).
BAD_STRUCTURE = [
    ("window-0", "sliding_window", 0),
    ("window-negative", "sliding_window", -2),
    ("window-float", "sliding_window", 2.0),
    ("window-bool", "sliding_window", True),
    ("window-string", "sliding_window", "2"),
    ("window-pair-length", "sliding_window", (1, 2, 3)),
    ("window-pair-negative", "sliding_window", (2, -1)),
    ("soft-cap-0", "logit_soft_cap", 0),
    ("soft-cap-negative", "logit_soft_cap", -5.0),
    ("soft-cap-nan", "logit_soft_cap", float("nan")),
    ("soft-cap-inf", "logit_soft_cap", float("inf")),
    ("soft-cap-string", "logit_soft_cap", "5"),
    ("alibi-float", "alibi", 1.5),
    ("alibi-string", "alibi", "yes"),
]
STRUCTURED = {
    "sdpa": (SDPA, lambda **kw: structured(**kw)()),
    "mhsa": (MHSA, lambda **kw: ka.MultiHeadSelfAttention(2, **kw)),
    "cross": (CROSS, lambda **kw: ka.CrossAttention(2, **kw)),
    "encoder": (ENC, lambda **kw: ka.TransformerEncoderBlock(2, 16, **kw)),
    "decoder-block": (
        DEC,
        lambda **kw: ka.TransformerDecoderBlock(2, 16, **kw),
    ),
}
for prefix, (who, make) in STRUCTURED.items():
    for suffix, argument, value in BAD_STRUCTURE:
        CASES[f"{prefix}-{suffix}"] = (
            who,
            argument,
            lambda make=make, argument=argument, value=value: make(
                **{argument: value}
            ),
        )

CASES.update(
    {
        "sdpa-causal-hyphen": (
            SDPA,
            "is_causal",
            structured(is_causal="bottom-right"),
        ),
        "sdpa-causal-left": (SDPA, "is_causal", structured(is_causal="left")),
        "sdpa-segments-rank": (
            SDPA,
            "segment_ids",
            structured(segment_ids=ids(T)),
        ),
        "sdpa-segments-batch": (
            SDPA,
            "segment_ids",
            structured(segment_ids=(ids(3, T), ids(3, S))),
        ),
        "sdpa-segments-one-for-two-lengths": (
            SDPA,
            "segment_ids",
            structured(segment_ids=ids(B, T)),
        ),
        "sdpa-segments-key-length": (
            SDPA,
            "segment_ids",
            structured(segment_ids=(ids(B, T), ids(B, 5))),
        ),
        "sdpa-segments-float": (
            SDPA,
            "segment_ids",
            structured(segment_ids=(ids(B, T, dtype="float32"), ids(B, S))),
        ),
        "sdpa-segments-bool": (
            SDPA,
            "segment_ids",
            structured(segment_ids=(ids(B, T), ids(B, S, dtype="bool"))),
        ),
        "sdpa-segments-string": (
            SDPA,
            "segment_ids",
            structured(segment_ids="1 1 2"),
        ),
        "sdpa-segments-triple": (
            SDPA,
            "segment_ids",
            structured(segment_ids=(ids(B, T), ids(B, S), ids(B, S))),
        ),
        "sdpa-segments-none": (
            SDPA,
            "segment_ids",
            structured(segment_ids=(ids(B, T), None)),
        ),
        "sdpa-segments-list-pair": (
            SDPA,
            "segment_ids",
            structured(segment_ids=[ids(B, T), ids(B, S)]),
        ),
        "explain-window": (
            "explain",
            "sliding_window",
            explained(sliding_window=(2,)),
        ),
        "explain-causal": ("explain", "is_causal", explained(is_causal="left")),
        "explain-segments": (
            "explain",
            "segment_ids",
            explained(segment_ids=(ids(B, T, dtype="float32"), ids(B, S))),
        ),
        "explain-soft-cap": (
            "explain",
            "logit_soft_cap",
            explained(logit_soft_cap=-1.0),
        ),
        "structure-mask-length": (
            "structure_mask",
            "query_length",
            lambda: structure_mask(-1, S),
        ),
        "structure-mask-float-length": (
            "structure_mask",
            "key_length",
            lambda: structure_mask(T, 2.5),
        ),
        "structure-mask-window": (
            "structure_mask",
            "sliding_window",
            lambda: structure_mask(T, S, sliding_window=0),
        ),
        "mhsa-segments-rank": (
            MHSA,
            "segment_ids",
            lambda: ka.MultiHeadSelfAttention(2)(
                x(B, T, D), segment_ids=ids(T)
            ),
        ),
        "mhsa-segments-length": (
            MHSA,
            "segment_ids",
            lambda: ka.MultiHeadSelfAttention(2)(
                x(B, T, D), segment_ids=ids(B, 5)
            ),
        ),
        "mhsa-segments-float": (
            MHSA,
            "segment_ids",
            lambda: ka.MultiHeadSelfAttention(2)(
                x(B, T, D), segment_ids=ids(B, T, dtype="float32")
            ),
        ),
        "mhsa-segments-bool": (
            MHSA,
            "segment_ids",
            lambda: ka.MultiHeadSelfAttention(2)(
                x(B, T, D), segment_ids=ids(B, T, dtype="bool")
            ),
        ),
        "mhsa-segments-cache": (
            MHSA,
            "segment_ids",
            lambda: ka.MultiHeadSelfAttention(2)(
                x(B, 1, D),
                cache=x(B, 2, 4, 2, 4),
                cache_index=0,
                segment_ids=ids(B, 1),
            ),
        ),
        "mhsa-explain-segments": (
            MHSA,
            "segment_ids",
            lambda: built_mhsa().explain(T, segment_ids=ids(1, 5)),
        ),
        "cross-segments-one-for-two-lengths": (
            CROSS,
            "segment_ids",
            lambda: ka.CrossAttention(2)(
                x(B, T, D), x(B, S, D), segment_ids=ids(B, T)
            ),
        ),
        "cross-segments-triple": (
            CROSS,
            "segment_ids",
            lambda: ka.CrossAttention(2)(
                x(B, T, D), x(B, S, D), segment_ids=(ids(B, T),) * 3
            ),
        ),
        "cross-segments-source-length": (
            CROSS,
            "segment_ids",
            lambda: ka.CrossAttention(2)(
                x(B, T, D), x(B, S, D), segment_ids=(ids(B, T), ids(B, 5))
            ),
        ),
        "cross-segments-float": (
            CROSS,
            "segment_ids",
            lambda: ka.CrossAttention(2)(
                x(B, T, D),
                x(B, S, D),
                segment_ids=(ids(B, T), ids(B, S, dtype="float32")),
            ),
        ),
        "mhsa-qk-norm": (
            MHSA,
            "use_qk_norm",
            lambda: ka.MultiHeadSelfAttention(2, use_qk_norm="yes"),
        ),
        "cross-qk-norm": (
            CROSS,
            "use_qk_norm",
            lambda: ka.CrossAttention(2, use_qk_norm=None),
        ),
        "decoder-block-qk-norm": (
            DEC,
            "use_qk_norm",
            lambda: ka.TransformerDecoderBlock(2, 16, use_qk_norm=1),
        ),
        "mhsa-causal-string": (
            MHSA,
            "use_causal_mask",
            lambda: ka.MultiHeadSelfAttention(2)(
                x(B, T, D), use_causal_mask="left"
            ),
        ),
        "mhsa-causal-none": (
            MHSA,
            "use_causal_mask",
            lambda: ka.MultiHeadSelfAttention(2)(
                x(B, T, D), use_causal_mask=None
            ),
        ),
        "mhsa-explain-ids-for-inputs": (
            MHSA,
            "length",
            lambda: built_mhsa().explain(ids(B, T)),
        ),
        "mhsa-explain-key-length": (
            MHSA,
            "key_length",
            lambda: built_mhsa().explain(x(B, T, D), key_length="S"),
        ),
        "mhsa-explain-causal": (
            MHSA,
            "use_causal_mask",
            lambda: built_mhsa().explain(T, use_causal_mask="bottom-right"),
        ),
        "decoder-block-causal-string": (
            DEC,
            "use_causal_mask",
            lambda: ka.TransformerDecoderBlock(2, 16)(
                x(B, T, D), use_causal_mask="left"
            ),
        ),
        "encoder-segments-length": (
            ENC,
            "segment_ids",
            lambda: ka.TransformerEncoderBlock(2, 16)(
                x(B, T, D), segment_ids=ids(B, 5)
            ),
        ),
        "decoder-block-segments-float": (
            DEC,
            "segment_ids",
            lambda: ka.TransformerDecoderBlock(2, 16)(
                x(B, T, D), segment_ids=ids(B, T, dtype="float32")
            ),
        ),
        "decoder-block-segments-cache": (
            DEC,
            "segment_ids",
            lambda: ka.TransformerDecoderBlock(2, 16)(
                x(B, 1, D),
                cache=x(B, 2, 4, 2, 8),
                cache_index=0,
                segment_ids=ids(B, 1),
            ),
        ),
        "segment-positions-rank": (
            "segment_positions",
            "segment_ids",
            lambda: segment_positions([1, 1, 2]),
        ),
        "segment-positions-float": (
            "segment_positions",
            "segment_ids",
            lambda: segment_positions(np.array([[1.2, 1.7, 2.0]])),
        ),
        "segment-positions-string": (
            "segment_positions",
            "segment_ids",
            lambda: segment_positions("1 1 2"),
        ),
        "learned-position-max-length": (
            "PositionEmbedding",
            "positions",
            lambda: ka.PositionEmbedding(4)(
                x(B, T, D), positions=ids(B, T) * 4
            ),
        ),
    }
)

# Explicit positions, each bad call on every position layer:
# (case suffix, argument, call arguments).
BAD_POSITIONS = [
    ("both", "segment_ids", {"positions": ids(B, T), "segment_ids": ids(B, T)}),
    ("positions-rank", "positions", {"positions": ids(T)}),
    ("positions-shape", "positions", {"positions": ids(B, 5)}),
    ("positions-float", "positions", {"positions": ids(B, T, dtype="float32")}),
    ("positions-negative", "positions", {"positions": -ids(B, T)}),
    (
        "positions-int32",
        "positions",
        {"positions": ids(B, T, dtype="uint32") * 2**31},
    ),
    ("positions-string", "positions", {"positions": "0 1 2"}),
    (
        "positions-start",
        "start_index",
        {"positions": ids(B, T), "start_index": 1},
    ),
    (
        "segments-start",
        "start_index",
        {"segment_ids": ids(B, T), "start_index": 1},
    ),
    ("segments-shape", "segment_ids", {"segment_ids": ids(3, T)}),
    (
        "segments-float",
        "segment_ids",
        {"segment_ids": ids(B, T, dtype="float32")},
    ),
    ("segments-pair", "segment_ids", {"segment_ids": (ids(B, T), ids(B, T))}),
]
POSITION_LAYERS = {
    "learned": ("PositionEmbedding", lambda: ka.PositionEmbedding(4)),
    "sinusoidal": ("PositionalEncoding", ka.PositionalEncoding),
    "rotary": ("RotaryEmbedding", ka.RotaryEmbedding),
}
for prefix, (who, make) in POSITION_LAYERS.items():
    for suffix, argument, arguments in BAD_POSITIONS:
        CASES[f"{prefix}-{suffix}"] = (
            who,
            argument,
            lambda make=make, arguments=arguments: make()(
                x(B, T, D), **arguments
            ),
        )


def built(layer, *inputs):
    """`layer` called once on `inputs` (built for their sizes)."""
    layer(*inputs)
    return layer


def built_decoder():
    return built(ka.TransformerDecoderBlock(2, 16), x(B, T, D))


def built_cross_decoder():
    block = ka.TransformerDecoderBlock(2, 16)
    block(x(B, T, D), x(B, S, D))
    return block


def decoder_step(edit, luong=False, padding=None):
    """`AttentionDecoder.step` with the state of `get_initial_state`
    changed by `edit(state)`, and the `encoder_padding_mask` `padding`."""
    if luong:
        decoder = ka.AttentionDecoder(
            keras.layers.GRUCell(D), ka.LuongAttention("general"), flow="luong"
        )
    else:
        decoder = gru_decoder()
    source = x(B, S, D)
    decoder(x(B, T, D), source)
    state = edit(decoder.get_initial_state(source))
    return lambda: decoder.step(x(B, D), state, source, padding)


CASES.update(
    {
        # Calls after build: the feature dims it was built with.
        "mhsa-dim-after-build": (
            MHSA,
            "inputs",
            lambda: built(ka.MultiHeadSelfAttention(2), x(B, T, D))(x(B, T, 6)),
        ),
        "cross-query-dim-after-build": (
            CROSS,
            "query",
            lambda: built(ka.CrossAttention(2), x(B, T, D), x(B, S, 6))(
                x(B, T, 4), x(B, S, 6)
            ),
        ),
        "cross-value-dim-after-build": (
            CROSS,
            "value",
            lambda: built(ka.CrossAttention(2), x(B, T, D), x(B, S, 6))(
                x(B, T, D), x(B, S, 7)
            ),
        ),
        "encoder-dim-after-build": (
            ENC,
            "inputs",
            lambda: built(ka.TransformerEncoderBlock(2, 16), x(B, T, D))(
                x(B, T, 6)
            ),
        ),
        "decoder-dim-after-build": (
            DEC,
            "inputs",
            lambda: built(
                ka.TransformerDecoderBlock(2, 16), x(B, T, D), x(B, S, 6)
            )(x(B, T, 4), x(B, S, 6)),
        ),
        "decoder-encoder-dim-after-build": (
            DEC,
            "encoder_outputs",
            lambda: built(
                ka.TransformerDecoderBlock(2, 16), x(B, T, D), x(B, S, 6)
            )(x(B, T, D), x(B, S, 7)),
        ),
        "learned-dim-after-build": (
            "PositionEmbedding",
            "inputs",
            lambda: built(ka.PositionEmbedding(4), x(B, T, D))(x(B, T, 6)),
        ),
        # Features: floating-point tensors (integers would reach the
        # projections as a backend type error, or be promoted silently).
        "mhsa-integer-features": (
            MHSA,
            "inputs.dtype=int32",
            lambda: ka.MultiHeadSelfAttention(2)(ids(B, T, D)),
        ),
        "cross-integer-value": (
            CROSS,
            "value.dtype=int32",
            lambda: ka.CrossAttention(2)(x(B, T, D), ids(B, S, D)),
        ),
        "encoder-integer-features": (
            ENC,
            "inputs.dtype=int32",
            lambda: ka.TransformerEncoderBlock(2, 16)(ids(B, T, D)),
        ),
        "decoder-integer-encoder-outputs": (
            DEC,
            "encoder_outputs.dtype=int32",
            lambda: ka.TransformerDecoderBlock(2, 16)(x(B, T, D), ids(B, S, D)),
        ),
        "learned-integer-features": (
            "PositionEmbedding",
            "inputs.dtype=int32",
            lambda: ka.PositionEmbedding(4)(ids(B, T, D)),
        ),
        "bahdanau-integer-memory": (
            "BahdanauAttention",
            "value.dtype=int32",
            lambda: ka.BahdanauAttention(4)(x(B, D), ids(B, S, D)),
        ),
        # Caches: floating-point tensors.
        "cache-integer": (
            MHSA,
            "cache.dtype=int32",
            lambda: ka.MultiHeadSelfAttention(2)(
                x(B, 1, D), cache=ids(B, 2, 4, 2, 4), cache_index=0
            ),
        ),
        "rolling-cache-none": (
            MHSA,
            "cache.kv of type NoneType",
            lambda: ka.MultiHeadSelfAttention(2, sliding_window=3)(
                x(B, 1, D), cache=ka.layers.RollingCache(None), cache_index=0
            ),
        ),
        "init-cache-unbuilt": (
            DEC,
            "an unbuilt block",
            lambda: ka.TransformerDecoderBlock(2, 16).init_cache(B, 4),
        ),
        "init-cache-batch": (
            DEC,
            "batch_size=-1",
            lambda: built_decoder().init_cache(-1, 4),
        ),
        "init-cache-dtype": (
            DEC,
            "dtype='int32'",
            lambda: built_decoder().init_cache(2, 4, dtype="int32"),
        ),
        "init-cache-encoder-batch": (
            DEC,
            "encoder_outputs.shape=(3, 4, 8)",
            lambda: built_cross_decoder().init_cache(
                B, 4, encoder_outputs=x(3, S, D)
            ),
        ),
        "init-cache-encoder-rank": (
            DEC,
            "encoder_outputs.shape=(2, 8)",
            lambda: built_cross_decoder().init_cache(
                B, 4, encoder_outputs=x(B, D)
            ),
        ),
        "init-cache-encoder-dim": (
            DEC,
            "encoder_outputs.shape=(2, 4, 6)",
            lambda: built_cross_decoder().init_cache(
                B, 4, encoder_outputs=x(B, S, 6)
            ),
        ),
        "init-cache-encoder-without-cross": (
            DEC,
            "encoder_outputs",
            lambda: built_decoder().init_cache(
                B, 4, encoder_outputs=x(B, S, D)
            ),
        ),
        "decoder-step-state-list": (
            "AttentionDecoder",
            "list",
            lambda: decoder_step(lambda state: list(state.values()))(),
        ),
        "decoder-step-state-keys": (
            "AttentionDecoder",
            "without ['keys']",
            lambda: decoder_step(lambda state: {"cell": state["cell"]})(),
        ),
        "decoder-step-cell-size": (
            "AttentionDecoder",
            "state['cell'] shapes [(2, 3)]",
            lambda: decoder_step(lambda state: {**state, "cell": [x(B, 3)]})(),
        ),
        "decoder-step-keys-batch": (
            "AttentionDecoder",
            "state['keys'].shape=(3, 4, 4)",
            lambda: decoder_step(lambda state: {**state, "keys": x(3, S, 4)})(),
        ),
        "decoder-step-feed": (
            "AttentionDecoder",
            "state['feed'].shape=(2, 3)",
            lambda: decoder_step(
                lambda state: {**state, "feed": x(B, 3)}, luong=True
            )(),
        ),
        "decoder-step-no-feed": (
            "AttentionDecoder",
            "without ['feed']",
            lambda: decoder_step(
                lambda state: {k: v for k, v in state.items() if k != "feed"},
                luong=True,
            )(),
        ),
    }
)

# An index is one integer: an int or a 0-d integer tensor.
BAD_INDICES = {
    "float": 1.5,
    "float-tensor": np.array(2.0, "float32"),
    "vector": np.array([1, 2], "int32"),
}
INDEX_CALLS = {  # who, argument, call(index)
    "sinusoidal": (
        "PositionalEncoding",
        "start_index",
        lambda i: ka.PositionalEncoding()(x(B, T, D), start_index=i),
    ),
    "learned": (
        "PositionEmbedding",
        "start_index",
        lambda i: ka.PositionEmbedding(8)(x(B, T, D), start_index=i),
    ),
    "rotary": (
        "RotaryEmbedding",
        "start_index",
        lambda i: ka.RotaryEmbedding()(x(B, T, D), start_index=i),
    ),
    "cross": (
        CROSS,
        "start_index",
        lambda i: ka.CrossAttention(2)(x(B, T, D), x(B, S, D), start_index=i),
    ),
    "cache": (
        MHSA,
        "cache_index",
        lambda i: ka.MultiHeadSelfAttention(2)(
            x(B, 1, D), cache=x(B, 2, 4, 2, 4), cache_index=i
        ),
    ),
    "rolling-cache": (
        MHSA,
        "cache_index",
        lambda i: ka.MultiHeadSelfAttention(2, sliding_window=4)(
            x(B, 1, D),
            cache=ka.layers.RollingCache(x(B, 2, 4, 2, 4)),
            cache_index=i,
        ),
    ),
}
for prefix, (who, argument, call) in INDEX_CALLS.items():
    for suffix, index in BAD_INDICES.items():
        CASES[f"{prefix}-index-{suffix}"] = (
            who,
            argument,
            lambda call=call, index=index: call(index),
        )

CASES.update(
    {
        "relative-bias-buckets": (
            "RelativePositionBias",
            "num_buckets",
            lambda: ka.RelativePositionBias(num_buckets=1),
        ),
        "relative-bias-too-few-buckets": (
            "RelativePositionBias",
            "num_buckets",
            lambda: ka.RelativePositionBias(num_buckets=3),
        ),
        "relative-bias-distance": (
            "RelativePositionBias",
            "max_distance",
            lambda: ka.RelativePositionBias(max_distance=0.5),
        ),
        "relative-bias-heads": (
            "RelativePositionBias",
            "table",
            lambda: bias_shared_by_other_heads(),  # defined below
        ),
        "self-attention-cached-ids-short": (
            MHSA,
            "segment_ids",
            lambda: cached_document_step(ids_length=4),
        ),
        "cross-attention-cached-key-ids-long": (
            CROSS,
            "segment_ids",
            lambda: cached_cross_document_step(key_ids_length=S + 2),
        ),
        "cross-attention-cached-query-ids-short": (
            CROSS,
            "segment_ids",
            lambda: cached_cross_document_step(query_ids_length=2),
        ),
        "self-attention-mask-mod": (
            "MultiHeadSelfAttention",
            "mask_mod",
            lambda: ka.MultiHeadSelfAttention(2)(x(B, T, D), mask_mod="causal"),
        ),
        "self-attention-score-mod": (
            "MultiHeadSelfAttention",
            "score_mod",
            lambda: ka.MultiHeadSelfAttention(2, score_mod=1.0),
        ),
        "encoder-block-score-mod": (
            "TransformerEncoderBlock",
            "score_mod",
            lambda: ka.TransformerEncoderBlock(2, 8, score_mod="t5"),
        ),
    }
)


def cached_document_step(ids_length):
    """A step at position 3 over a cache of 6 slots, whose document ids
    stop short of the slots the step reads (JAX clamped them silently)."""
    ids = np.ones((B, ids_length), "int32")
    return ka.MultiHeadSelfAttention(2)(
        x(B, 1, D),
        cache=x(B, 2, 6, 2, 4),
        cache_index=3,
        mask_mod=mods.document(ids),
    )


def cached_cross_document_step(query_ids_length=3, key_ids_length=S):
    """A cross-attention step at position 2 over a cached source of S
    keys: the key ids index the source, the query ids the sequence."""
    layer = ka.CrossAttention(2)
    source = x(B, S, D)
    layer(x(B, 1, D), source)
    query_ids = np.ones((B, query_ids_length), "int32")
    key_ids = np.ones((B, key_ids_length), "int32")
    return layer(
        x(B, 1, D),
        None,
        cache=layer.compute_cache(source),
        start_index=2,
        mask_mod=mods.document((query_ids, key_ids)),
    )


def bias_shared_by_other_heads():
    """A bias built for two heads, then given to an attention of four."""
    bias = ka.RelativePositionBias(num_buckets=8, max_distance=16)
    ka.MultiHeadSelfAttention(2, score_mod=bias)(x(B, T, D))
    ka.MultiHeadSelfAttention(4, score_mod=bias)(x(B, T, D))


def our_message(error, who):
    """The library's own line of an error (Keras wraps errors raised in
    `call` with "Exception encountered when calling ..." and the call's
    arguments)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))  # terminal colours
    lines = [line.strip() for line in text.splitlines()]
    return next((line for line in lines if line.startswith(who)), text)


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_a_clear_value_error(case):
    who, argument, call = CASES[case]
    with pytest.raises(ValueError) as info:
        call()
    message = our_message(info.value, who)
    assert message.startswith(who), message
    received = message.split("Received:", 1)
    assert len(received) == 2, message
    assert argument in received[1], message


def test_every_public_layer_is_fuzzed():
    layers = {
        name
        for name in ka.__all__
        if isinstance(getattr(ka, name), type)
        and issubclass(getattr(ka, name), keras.layers.Layer)
    }
    assert layers - {"AttentionMechanism"} <= {
        who for who, _, _ in CASES.values()
    }


def test_a_window_wider_than_int32_positions_is_no_bound():
    """Bounds past any sequence are no bounds, not int32 overflows into
    hidden keys (a silent wrong answer)."""
    q = np.random.default_rng(0).standard_normal((1, 4, 8)).astype("float32")
    for huge, bounded in (((0, 2**31 - 1), (0, 4)), (10**30, 4)):
        got = scaled_dot_product_attention(q, q, q, sliding_window=huge)
        want = scaled_dot_product_attention(q, q, q, sliding_window=bounded)
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(got),
            keras.ops.convert_to_numpy(want),
            atol=1e-6,
        )


@pytest.mark.skipif(
    keras.backend.backend() == "jax",
    reason="Keras converts int64 call arguments to int32 on JAX",
)
def test_wide_segment_ids_restart_positions():
    """Distinct int64 ids equal modulo 2**32 are different sequences."""
    wide = np.array([[2**32, 2**33, 2**33 + 1]], "int64")
    layer = ka.PositionalEncoding()
    inputs = x(1, 3, 4)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(layer(inputs, segment_ids=wide)),
        keras.ops.convert_to_numpy(layer(inputs, positions=ids(1, 3) * 0)),
        atol=1e-6,
    )
