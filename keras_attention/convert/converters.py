"""The converters: `from_keras`, `to_keras` and
`replace_transformer_layers` (see `keras_attention.convert`)."""

import sys

import keras

from keras_attention.convert import _weights as _conversion
from keras_attention.convert._weights import copy as _copy
from keras_attention.convert._weights import describe as _where
from keras_attention.convert._weights import (
    relative_weights as _relative_weights,
)
from keras_attention.layers.cross_attention import CrossAttention
from keras_attention.layers.multi_head_self_attention import (
    MultiHeadSelfAttention,
)
from keras_attention.layers.transformer_decoder_block import (
    TransformerDecoderBlock,
)
from keras_attention.layers.transformer_encoder_block import (
    TransformerEncoderBlock,
)

# keras-hub's TransformerDecoder call arguments and ours.
_DECODER_ARGUMENTS = {
    "decoder_padding_mask": "padding_mask",
    "decoder_attention_mask": "attention_mask",
    "encoder_padding_mask": "encoder_padding_mask",
    "encoder_attention_mask": "encoder_attention_mask",
    "use_causal_mask": "use_causal_mask",
    "training": "training",
}


def from_keras(
    layer: keras.layers.Layer, cross_attention: bool = False
) -> keras.layers.Layer:
    """The `keras_attention` layer equivalent to a built Keras layer.

    Dispatches on the type of `layer` (see the list above) and copies its
    weights by path into a new layer of the same name and dtype policy.

    Args:
        layer (keras.layers.Layer): A built `keras.layers.MultiHeadAttention`,
            `keras.layers.GroupQueryAttention`, or keras-hub
            `CachedMultiHeadAttention`, `TransformerEncoder` or
            `TransformerDecoder`.
        cross_attention: For the attention layers: make a `CrossAttention`
            (`call(query, value, ...)`) instead of a
            `MultiHeadSelfAttention` (`call(inputs, ...)`, which needs
            queries, keys and values of one dim). A Keras attention layer
            does not know which way it is used. Defaults to `False`.

    Returns:
        keras.layers.Layer: A built `MultiHeadSelfAttention`,
            `CrossAttention`, `TransformerEncoderBlock` or
            `TransformerDecoderBlock` with the weights of `layer`.

    Examples:
        >>> import keras
        >>> theirs = keras.layers.GroupQueryAttention(
        ...     head_dim=4, num_query_heads=4, num_key_value_heads=2)
        >>> theirs.build((None, None, 16), (None, None, 12))
        >>> ours = from_keras(theirs, cross_attention=True)
        >>> type(ours).__name__, ours.num_key_value_heads
        ('CrossAttention', 2)
    """
    where = _where("from_keras", layer)
    hub = sys.modules.get("keras_hub")
    blocks = _hub_blocks()
    attention = [
        keras.layers.MultiHeadAttention,
        keras.layers.GroupQueryAttention,
    ]
    if hub is not None:
        attention.append(hub.layers.CachedMultiHeadAttention)
    _conversion.check_type(where, layer, (*blocks, *attention))
    _conversion.check_flag(where, "cross_attention", cross_attention)
    _conversion.check_built(where, layer)
    if type(layer) in blocks:
        if cross_attention:
            raise ValueError(
                f"{where}: `cross_attention` is for the attention layers; "
                "a block has cross-attention if its weights do. Received: "
                f"cross_attention=True, layer={type(layer).__name__}"
            )
        if type(layer) is hub.layers.TransformerEncoder:
            return _encoder_from_hub(where, layer)
        return _decoder_from_hub(where, layer)
    grouped = type(layer) is keras.layers.GroupQueryAttention
    return _from_attention(where, layer, cross_attention, grouped)


def to_keras(layer: keras.layers.Layer) -> keras.layers.Layer:
    """The Keras or keras-hub layer equivalent to a built layer of ours.

    `MultiHeadSelfAttention` and `CrossAttention` become a
    `keras.layers.MultiHeadAttention` (`GroupQueryAttention` with
    `num_key_value_heads < num_heads`); `TransformerEncoderBlock` and
    `TransformerDecoderBlock` become keras-hub's `TransformerEncoder` and
    `TransformerDecoder` (keras-hub must be installed).

    Args:
        layer (keras.layers.Layer): A built layer of ours, of one of the
            types above.

    Returns:
        keras.layers.Layer: A built layer with the weights of `layer`.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> from keras_attention import CrossAttention
        >>> ours = CrossAttention(num_heads=2)
        >>> query = np.random.rand(1, 3, 8).astype("float32")
        >>> value = np.random.rand(1, 4, 6).astype("float32")
        >>> want = ours(query, value)
        >>> theirs = to_keras(ours)
        >>> type(theirs).__name__
        'MultiHeadAttention'
        >>> diff = keras.ops.abs(theirs(query, value) - want)
        >>> bool(keras.ops.convert_to_numpy(keras.ops.max(diff)) < 1e-5)
        True
    """
    where = _where("to_keras", layer)
    attention = (MultiHeadSelfAttention, CrossAttention)
    blocks = (TransformerEncoderBlock, TransformerDecoderBlock)
    _conversion.check_type(where, layer, (*attention, *blocks))
    _conversion.check_built(where, layer)
    if type(layer) in attention:
        return _attention_to_keras(where, layer)
    return _block_to_hub(where, layer)


def replace_transformer_layers(backbone: keras.Model) -> keras.Model:
    """A copy of a keras-hub backbone with our Transformer blocks in it.

    Every keras-hub `TransformerEncoder` and `TransformerDecoder` of the
    functional `backbone` is replaced by the `from_keras` block of the same
    name, and every other layer by a copy with the same weights; a
    functional model inside it (the backbone of a task model such as
    `GPT2CausalLM`, or of a model of yours) is replaced in the same way.
    The backbone itself is not changed. The result is a `keras.Model` with the
    backbone's inputs and outputs (not an instance of the backbone's
    class: its config describes keras-hub's layers) that gives the same
    outputs. keras-hub's decoder call arguments are renamed
    (`decoder_sequence` to `inputs`, `encoder_sequence` to
    `encoder_outputs`, `decoder_padding_mask` to `padding_mask`); BERT's
    `segment_ids`, which are token types, stay with its segment embedding
    and never reach our `segment_ids` (packed sequences).

    For incremental decoding, call the blocks (`model.get_layer(name)`)
    with `cache` and `cache_index` in a step function for
    `keras_attention.decoding`.

    Args:
        backbone (keras.Model): A built functional model, such as
            `keras_hub.models.GPT2Backbone`, `BertBackbone` or
            `BartBackbone`.

    Returns:
        keras.Model: The functional model with our blocks.

    Examples:
        >>> import keras
        >>> x = keras.Input((None, 8))
        >>> theirs = keras.Model(x, keras.layers.Dense(8, name="dense")(x))
        >>> ours = replace_transformer_layers(theirs)  # nothing to replace
        >>> [type(layer).__name__ for layer in ours.layers]
        ['InputLayer', 'Dense']
    """
    where = _where("replace_transformer_layers", backbone)
    if not _functional(backbone):
        raise ValueError(
            f"{where}: needs a functional model (a keras-hub backbone). "
            f"Received: backbone={type(backbone).__name__}"
        )
    blocks = _hub_blocks()
    sources = {}

    def clone(layer):
        if type(layer) in blocks:
            return from_keras(layer)
        if _functional(layer):  # a backbone inside a task model
            return replace_transformer_layers(layer)
        copy = layer.__class__.from_config(layer.get_config())
        sources[id(copy)] = layer
        return copy

    def call(layer, *args, **kwargs):
        if isinstance(layer, TransformerDecoderBlock):
            args, kwargs = _decoder_call(layer, args, kwargs)
        return layer(*args, **kwargs)

    model = keras.models.clone_model(
        backbone, clone_function=clone, call_function=call
    )
    for layer in model.layers:
        if id(layer) in sources:
            _copy(where, sources[id(layer)], layer, rename=lambda path: path)
    return model


def _from_attention(where, layer, cross_attention, grouped):
    config = layer.get_config()
    _conversion.check_keras_attention(where, layer, config)
    weights = _relative_weights(layer)
    query = weights["query/kernel"].shape  # (Dq, N, H)
    key = weights["key/kernel"].shape  # (Dk, K, H)
    value = weights["value/kernel"].shape  # (Dv, K, V)
    if not cross_attention and not query[0] == key[0] == value[0]:
        raise ValueError(
            f"{where}: queries, keys and values of different dims need "
            "`cross_attention=True`. Received: cross_attention=False, "
            f"query dim {query[0]}, key dim {key[0]}, value dim {value[0]}"
        )
    window = config.get("sliding_window")
    arguments = dict(
        num_heads=query[1],
        key_dim=query[2],
        value_dim=None if value[2] == query[2] else value[2],
        dropout=config["dropout"],
        use_bias=config["use_bias"],
        num_key_value_heads=key[1] if grouped else None,
        kernel_initializer=config["kernel_initializer"],
        bias_initializer=config["bias_initializer"],
        sliding_window=None if window is None else (window - 1, window - 1),
        dtype=layer.dtype_policy,
        name=layer.name,
    )
    if cross_attention:
        ours = CrossAttention(**arguments)
        ours.build((None, None, query[0]), (None, None, value[0]),
                   (None, None, key[0]))  # fmt: skip
    else:
        ours = MultiHeadSelfAttention(**arguments)
        ours.build((None, None, query[0]))
    _copy(where, layer, ours)
    return ours


def _encoder_from_hub(where, layer):
    attention = layer._self_attention_layer
    _conversion.check_keras_attention(where, attention, attention.get_config())
    model_dim = _relative_weights(attention)["query/kernel"].shape[0]
    ours = TransformerEncoderBlock(**_block_arguments(layer, model_dim))
    ours.build((None, None, model_dim))
    _copy(where, layer, ours)
    return ours


def _decoder_from_hub(where, layer):
    attention = layer._self_attention_layer
    _conversion.check_keras_attention(where, attention, attention.get_config())
    model_dim = _relative_weights(attention)["query/kernel"].shape[0]
    encoder_shape = None
    if layer._cross_attention_layer is not None:
        key = _relative_weights(layer._cross_attention_layer)["key/kernel"]
        encoder_shape = (None, None, key.shape[0])
    ours = TransformerDecoderBlock(**_block_arguments(layer, model_dim))
    ours.build((None, None, model_dim), encoder_shape)
    _copy(where, layer, ours)
    return ours


def _block_arguments(layer, model_dim):
    head_dim = model_dim // layer.num_heads
    return dict(
        num_heads=layer.num_heads,
        intermediate_dim=layer.intermediate_dim,
        key_dim=None if head_dim * layer.num_heads == model_dim else head_dim,
        dropout=layer.dropout,
        activation=_conversion.activation(layer.activation),
        layer_norm_epsilon=layer.layer_norm_epsilon,
        normalize_first=layer.normalize_first,
        kernel_initializer=layer.kernel_initializer,
        bias_initializer=layer.bias_initializer,
        dtype=layer.dtype_policy,
        name=layer.name,
    )


def _attention_to_keras(where, layer):
    _conversion.refuse_structure(where, layer)
    head_dim, value_dim = layer._head_dim, layer._value_head_dim
    weights = _relative_weights(layer)
    query = weights["query_dense/kernel"].shape[0]
    key = weights["key_dense/kernel"].shape[0]
    value = weights["value_dense/kernel"].shape[0]
    window = layer.sliding_window
    common = dict(
        dropout=layer.dropout,
        use_bias=layer.use_bias,
        sliding_window=None if window is None else window[0] + 1,
        kernel_initializer=layer.kernel_initializer,
        bias_initializer=layer.bias_initializer,
        dtype=layer.dtype_policy,
        name=layer.name,
    )
    if layer.kv_heads == layer.num_heads:
        theirs = keras.layers.MultiHeadAttention(
            layer.num_heads, head_dim, value_dim, **common
        )
    elif value_dim != head_dim:
        raise ValueError(
            f"{where}: Keras's GroupQueryAttention has one head dim for "
            "queries, keys and values. Received: "
            f"key_dim={head_dim}, value_dim={value_dim}"
        )
    else:
        theirs = keras.layers.GroupQueryAttention(
            head_dim, layer.num_heads, layer.kv_heads, **common
        )
    theirs.build((None, None, query), (None, None, value), (None, None, key))
    _copy(where, theirs, layer, backward=True)
    return theirs


def _block_to_hub(where, layer):
    hub = _import_keras_hub(where)
    _conversion.refuse_structure(where, layer, block=True)
    weights = _relative_weights(layer.self_attention)
    model_dim = weights["query_dense/kernel"].shape[0]
    if layer.self_attention._head_dim != model_dim // layer.num_heads:
        raise ValueError(
            f"{where}: keras-hub's blocks use heads of dim D // num_heads "
            f"({model_dim // layer.num_heads}). Received: "
            f"key_dim={layer.key_dim}"
        )
    arguments = dict(
        intermediate_dim=layer.intermediate_dim,
        num_heads=layer.num_heads,
        dropout=layer.dropout,
        activation=_conversion.activation(layer.activation, to_hub=True),
        layer_norm_epsilon=layer.layer_norm_epsilon,
        kernel_initializer=layer.kernel_initializer,
        bias_initializer=layer.bias_initializer,
        normalize_first=layer.normalize_first,
        dtype=layer.dtype_policy,
        name=layer.name,
    )
    shape = (None, None, model_dim)
    if isinstance(layer, TransformerEncoderBlock):
        theirs = hub.layers.TransformerEncoder(**arguments)
        theirs.build(shape)
    else:
        theirs = hub.layers.TransformerDecoder(**arguments)
        encoder_shape = None
        if layer.cross_attention is not None:
            weights = _relative_weights(layer.cross_attention)
            encoder_shape = (None, None, weights["key_dense/kernel"].shape[0])
        theirs.build(shape, encoder_shape)
    _copy(where, theirs, layer, backward=True)
    return theirs


def _import_keras_hub(where):
    try:
        import keras_hub
    except ImportError as error:
        raise ImportError(
            f"{where}: converting a Transformer block needs keras-hub "
            "(`pip install keras-hub`)."
        ) from error
    return keras_hub


def _decoder_call(layer, args, kwargs):
    """keras-hub's `TransformerDecoder` call arguments as ours."""
    where = _where("replace_transformer_layers", layer)
    if len(args) > 2:
        raise ValueError(
            f"{where}: pass the decoder's masks by name. Received: "
            f"{len(args)} positional arguments"
        )
    kwargs = dict(kwargs)
    # BART passes the two sequences by name.
    for position, name in enumerate(("decoder_sequence", "encoder_sequence")):
        if name in kwargs:
            if len(args) != position:
                raise ValueError(
                    f"{where}: keras-hub's `{name}` is given twice or out "
                    f"of order. Received: {len(args)} positional arguments "
                    f"and {name}"
                )
            args = (*args, kwargs.pop(name))
    renamed = {}
    for name, value in kwargs.items():
        if name not in _DECODER_ARGUMENTS:
            raise ValueError(
                f"{where}: keras-hub's `{name}` has no equivalent in the "
                f"graph of a converted backbone. Received: {name}={value!r}"
            )
        renamed[_DECODER_ARGUMENTS[name]] = value
    return args, renamed


def _functional(model):
    """Whether `model` is a functional model (a graph of layers)."""
    return isinstance(model, keras.Model) and hasattr(
        model, "_run_through_graph"
    )


def _hub_blocks():
    """keras-hub's Transformer blocks, if keras-hub is imported."""
    hub = sys.modules.get("keras_hub")
    if hub is None:
        return ()
    return (hub.layers.TransformerEncoder, hub.layers.TransformerDecoder)
