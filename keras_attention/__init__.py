"""keras_attention: attention layers for Keras 3 on every backend.

Bahdanau and Luong attention for RNN decoders and the Transformer's
attention layers and blocks, as Keras 3 layers that run on TensorFlow,
JAX and PyTorch.
"""

from keras_attention import functional as functional
from keras_attention.layers import AttentionDecoder as AttentionDecoder
from keras_attention.layers import AttentionMechanism as AttentionMechanism
from keras_attention.layers import BahdanauAttention as BahdanauAttention
from keras_attention.layers import CrossAttention as CrossAttention
from keras_attention.layers import LuongAttention as LuongAttention
from keras_attention.layers import (
    MultiHeadSelfAttention as MultiHeadSelfAttention,
)
from keras_attention.layers import PositionalEncoding as PositionalEncoding
from keras_attention.layers import PositionEmbedding as PositionEmbedding
from keras_attention.layers import RotaryEmbedding as RotaryEmbedding
from keras_attention.layers import (
    TransformerDecoderBlock as TransformerDecoderBlock,
)
from keras_attention.layers import (
    TransformerEncoderBlock as TransformerEncoderBlock,
)
from keras_attention.version import __version__ as __version__

__all__ = [
    "AttentionDecoder",
    "AttentionMechanism",
    "BahdanauAttention",
    "CrossAttention",
    "LuongAttention",
    "MultiHeadSelfAttention",
    "PositionEmbedding",
    "PositionalEncoding",
    "RotaryEmbedding",
    "TransformerDecoderBlock",
    "TransformerEncoderBlock",
    "__version__",
    "functional",
]
