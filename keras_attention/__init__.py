"""keras_attention: attention layers for Keras 3 on every backend.

Bahdanau and Luong attention for RNN decoders and the Transformer's
scaled dot-product attention, as Keras 3 layers that run on TensorFlow,
JAX and PyTorch.
"""

from keras_attention import functional as functional
from keras_attention.layers import AttentionMechanism as AttentionMechanism
from keras_attention.layers import BahdanauAttention as BahdanauAttention
from keras_attention.layers import LuongAttention as LuongAttention
from keras_attention.version import __version__ as __version__

__all__ = [
    "AttentionMechanism",
    "BahdanauAttention",
    "LuongAttention",
    "__version__",
    "functional",
]
