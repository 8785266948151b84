"""keras_attention: attention layers for Keras 3 on every backend.

Bahdanau and Luong attention for RNN decoders and the Transformer's
attention layers and blocks, as Keras 3 layers that run on TensorFlow,
JAX and PyTorch.

The submodules `functional`, `mods`, `decoding` and `convert` are
imported with the package; `datasets` and `visualization`, which serve
optional extras, are imported on first use
(`keras_attention.visualization.plot_attention(...)`). The package
imports without matplotlib, Babel, num2words or keras-hub; only the
functions that need one of them ask for it.
"""

import importlib as _importlib

from keras_attention import convert as convert
from keras_attention import decoding as decoding
from keras_attention import distribution as distribution
from keras_attention import functional as functional
from keras_attention import mods as mods
from keras_attention.layers import AttentionDecoder as AttentionDecoder
from keras_attention.layers import AttentionMechanism as AttentionMechanism
from keras_attention.layers import BahdanauAttention as BahdanauAttention
from keras_attention.layers import CrossAttention as CrossAttention
from keras_attention.layers import (
    LocationSensitiveAttention as LocationSensitiveAttention,
)
from keras_attention.layers import LuongAttention as LuongAttention
from keras_attention.layers import MonotonicAttention as MonotonicAttention
from keras_attention.layers import (
    MultiHeadSelfAttention as MultiHeadSelfAttention,
)
from keras_attention.layers import PositionalEncoding as PositionalEncoding
from keras_attention.layers import PositionEmbedding as PositionEmbedding
from keras_attention.layers import RelativePositionBias as RelativePositionBias
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
    "LocationSensitiveAttention",
    "LuongAttention",
    "MonotonicAttention",
    "MultiHeadSelfAttention",
    "PositionEmbedding",
    "PositionalEncoding",
    "RelativePositionBias",
    "RotaryEmbedding",
    "TransformerDecoderBlock",
    "TransformerEncoderBlock",
    "__version__",
    "convert",
    "datasets",
    "decoding",
    "distribution",
    "functional",
    "mods",
    "visualization",
]

_LAZY_SUBMODULES = ("datasets", "visualization")


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        module = _importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))
