"""What the converters of `keras_attention.convert` share: weights matched
by path, and the checks of what converts (error messages name the public
function)."""

import warnings

import keras

from keras_attention._core.checks import check_flag as check_flag
from keras_attention.layers.sublayers import gelu_approximate

# Keras / keras-hub sublayer names and ours, one path component each.
_NAMES = {
    "query": "query_dense",
    "key": "key_dense",
    "value": "value_dense",
    "attention_output": "output_dense",
    "self_attention_layer": "self_attention",
    "self_attention_layer_norm": "self_attention_norm",
    "cross_attention_layer_norm": "cross_attention_norm",
    "feedforward_layer_norm": "feedforward_norm",
}
_DROPPED = ("regularizer", "constraint")
# keras-hub's registered activations, which only keras-hub can load, and
# ours that compute the same.
_HUB_ACTIVATIONS = {
    "keras_hub>gelu_approximate": gelu_approximate,
    "keras_nlp>gelu_approximate": gelu_approximate,
}


def check_built(where, layer):
    """Weights exist only once a layer is built."""
    if not layer.built:
        raise ValueError(
            f"{where}: the layer must be built (called once, or `build`) so "
            "that its weights exist. Received: layer.built=False"
        )


def check_type(where, layer, types):
    """`layer` is of one of `types` exactly: a subclass may compute
    something else (its own `call`), which its weights do not show."""
    if type(layer) not in types:
        names = ", ".join(t.__name__ for t in types)
        raise ValueError(
            f"{where}: no conversion for this layer type; converted are "
            f"exactly {names} (a subclass may compute something else). "
            f"Received: layer={type(layer).__name__}"
        )


def describe(function, layer):
    """`convert.<function> (layer '<name>')`, how messages start."""
    return f"convert.{function} (layer '{getattr(layer, 'name', layer)}')"


def check_keras_attention(where, layer, config):
    """Refuses what our layers cannot express; warns about what does not
    change the outputs."""
    weights = relative_weights(layer)
    rank = len(weights["query/kernel"].shape)
    axes = config.get("attention_axes")
    if rank != 3 or axes not in (None, 1, [1], (1,)):
        raise ValueError(
            f"{where}: our layers attend over the sequence axis of `(B, T, "
            "D)` inputs only. Received: attention_axes="
            f"{axes!r}, query kernel shape "
            f"{tuple(weights['query/kernel'].shape)}"
        )
    model_dim = weights["query/kernel"].shape[0]
    output_shape = config.get("output_shape")
    if output_shape not in (None, model_dim, [model_dim], (model_dim,)):
        raise ValueError(
            f"{where}: our layers project back to the query's dim "
            f"({model_dim}). Received: output_shape={output_shape!r}"
        )
    if config.get("use_gate"):
        raise ValueError(
            f"{where}: gated attention has no equivalent here. Received: "
            "use_gate=True"
        )
    dropped = sorted(
        key
        for key, value in config.items()
        if value is not None and key.endswith(_DROPPED)
    )
    if dropped:
        warnings.warn(
            f"{where}: {', '.join(dropped)} do not change the outputs and "
            "are not converted.",
            stacklevel=4,
        )


def refuse_structure(where, layer, block=False):
    """Refuses our arguments Keras and keras-hub have no equivalent of."""
    unsupported = {
        "use_rotary": False,
        "alibi": False,
        "logit_soft_cap": None,
        "use_qk_norm": False,
        "score_mod": None,
    }
    if block:
        unsupported.update(
            sliding_window=None,
            num_key_value_heads=None,
            use_bias=True,
            use_rms_norm=False,
        )
    for name, default in unsupported.items():
        value = getattr(layer, name, default)  # CrossAttention: no rotary
        if value != default and not (
            name == "num_key_value_heads" and value == layer.num_heads
        ):
            raise ValueError(
                f"{where}: `{name}` has no equivalent in "
                f"{'keras-hub' if block else 'Keras'}. Received: "
                f"{name}={value!r}"
            )
    window = layer.sliding_window
    if window is not None and (
        not isinstance(window, tuple) or window[0] != window[1]
    ):
        raise ValueError(
            f"{where}: Keras's `sliding_window` is a symmetric band "
            "(`|i - j| < w`, our pair `(w - 1, w - 1)`); an int window or "
            f"an asymmetric pair has no equivalent. Received: "
            f"sliding_window={window!r}"
        )


def activation(function, to_hub=False):
    """A block's activation in the other library: keras-hub's tanh GELU
    becomes ours (so that our block loads without keras-hub) and, with
    `to_hub`, ours becomes keras-hub's; any other is kept."""
    if to_hub:
        if function is gelu_approximate:
            found = keras.saving.get_registered_object(
                "keras_hub>gelu_approximate"
            )
            return found or function
        return function
    name = keras.saving.get_registered_name(function)
    return _HUB_ACTIVATIONS.get(name, function)


def relative_weights(layer, where=None):
    """The layer's variables by path below the layer (`query/kernel`).

    Two variables of one path would make a copy assign one of them twice
    and leave the other as it was: a `ValueError` (naming `where`)."""
    prefix = (layer.path or layer.name) + "/"
    weights = {}
    for variable in layer.weights:
        path = variable.path
        if path.startswith(prefix):
            path = path[len(prefix) :]
        else:
            path = path.split("/", 1)[-1]
        if path in weights:
            raise ValueError(
                f"{where or describe('copy', layer)}: two weights of layer "
                f"'{layer.name}' have the path `{path}`, so they cannot be "
                f"matched by path. Received: {weights[path].path} and "
                f"{variable.path}"
            )
        weights[path] = variable
    return weights


def ours_path(path):
    """A Keras / keras-hub weight path with our sublayer names."""
    return "/".join(_NAMES.get(part, part) for part in path.split("/"))


def copy(where, theirs, ours, rename=ours_path, backward=False):
    """Copies `theirs` into `ours` (`backward`: `ours` into `theirs`),
    matching each of their paths, renamed, with one of ours. What is
    frozen stays frozen: the layer's `trainable`, and each weight's (a
    frozen sublayer's)."""
    origin, destination = (ours, theirs) if backward else (theirs, ours)
    _check_plain(where, origin)
    source = {rename(p): v for p, v in relative_weights(theirs, where).items()}
    target = relative_weights(ours, where)
    if backward:
        source, target = target, source
    if set(source) != set(target):
        raise ValueError(
            f"{where}: the weights do not correspond. Received: only in the "
            f"source {sorted(set(source) - set(target))}, only in the "
            f"target {sorted(set(target) - set(source))}"
        )
    destination.trainable = origin.trainable  # first: it sets every weight's
    for path, variable in target.items():
        value = source[path]
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(
                f"{where}: weight `{path}` has another shape. Received: "
                f"{tuple(value.shape)} for {tuple(variable.shape)}"
            )
        variable.assign(keras.ops.cast(value, variable.dtype))
        variable.trainable = value.trainable


def _check_plain(where, layer):
    """Refuses a source with quantized kernels or LoRA adapters, whose
    weights are not the float kernels the other library's layer holds."""
    for sublayer in layer._flatten_layers():
        if getattr(sublayer, "quantization_mode", None) is not None:
            raise ValueError(
                f"{where}: quantized layers are not converted; convert the "
                "float model, then quantize. Received: sublayer "
                f"'{sublayer.name}' with quantization_mode="
                f"{sublayer.quantization_mode!r}"
            )
        if getattr(sublayer, "lora_enabled", False):
            raise ValueError(
                f"{where}: LoRA is enabled; save and reload the model to "
                "merge the adapters into the kernels, then convert. "
                f"Received: sublayer '{sublayer.name}' with lora_enabled=True"
            )
