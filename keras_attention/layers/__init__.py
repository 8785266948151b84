"""Keras layers of keras_attention."""

from keras_attention.layers.attention_mechanism import (
    AttentionMechanism as AttentionMechanism,
)
from keras_attention.layers.bahdanau_attention import (
    BahdanauAttention as BahdanauAttention,
)
from keras_attention.layers.luong_attention import (
    LuongAttention as LuongAttention,
)
