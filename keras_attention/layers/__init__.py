"""Keras layers of keras_attention."""

from keras_attention.layers.attention_decoder import (
    AttentionDecoder as AttentionDecoder,
)
from keras_attention.layers.attention_mechanism import (
    AttentionMechanism as AttentionMechanism,
)
from keras_attention.layers.bahdanau_attention import (
    BahdanauAttention as BahdanauAttention,
)
from keras_attention.layers.cross_attention import (
    CrossAttention as CrossAttention,
)
from keras_attention.layers.kv_cache import RollingCache as RollingCache
from keras_attention.layers.location_sensitive_attention import (
    LocationSensitiveAttention as LocationSensitiveAttention,
)
from keras_attention.layers.luong_attention import (
    LuongAttention as LuongAttention,
)
from keras_attention.layers.monotonic_attention import (
    MonotonicAttention as MonotonicAttention,
)
from keras_attention.layers.multi_head_self_attention import (
    MultiHeadSelfAttention as MultiHeadSelfAttention,
)
from keras_attention.layers.position_embedding import (
    PositionEmbedding as PositionEmbedding,
)
from keras_attention.layers.positional_encoding import (
    PositionalEncoding as PositionalEncoding,
)
from keras_attention.layers.relative_position_bias import (
    RelativePositionBias as RelativePositionBias,
)
from keras_attention.layers.rotary_embedding import (
    RotaryEmbedding as RotaryEmbedding,
)
from keras_attention.layers.transformer_decoder_block import (
    TransformerDecoderBlock as TransformerDecoderBlock,
)
from keras_attention.layers.transformer_encoder_block import (
    TransformerEncoderBlock as TransformerEncoderBlock,
)
