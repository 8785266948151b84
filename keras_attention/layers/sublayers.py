"""Creating and calling a layer's own sublayers.

`fresh` gives each weight its own copy of an initializer. `invoke` calls a
built sublayer without Keras's per-call bookkeeping.

`Layer.__call__` converts inputs, opens name and autocast scopes, fills in
`training` and implicit masks and attaches output masks. Inside one of
this library's layers none of that changes a built sublayer's result in
inference when its variables are kept in its compute dtype: the outer
layer has already resolved masks and `training`. It does cost more than
the arithmetic of a one-token decoding step on an eager backend (about a
dozen sublayer calls per Transformer block: PyTorch spends most of a
cached step there), so those calls go straight to `call`.
"""

import keras


def fresh(initializer):
    """A copy of `initializer` for one more weight.

    A Keras initializer without a seed fixes one at construction, so a
    single instance shared by several weights of one shape (the query, key
    and value kernels) would give them all the same values. (A seeded
    initializer gives every copy the same values, as in
    `keras.layers.MultiHeadAttention`; a plain function is returned as is.)
    """
    if not isinstance(initializer, keras.initializers.Initializer):
        return initializer
    return initializer.__class__.from_config(initializer.get_config())


def invoke(layer, *args, training=None, **kwargs):
    """`layer(*args, training=training, **kwargs)`, as cheaply as is exact.

    Goes through `__call__` when it can matter: training, a layer not yet
    built, mixed precision (autocasting), a quantized layer, or inputs
    that are not yet tensors of the layer's compute dtype (NumPy arrays
    given to a public method such as `compute_cache`). In inference a
    `Dropout` is the identity and is skipped.
    """
    if (
        training
        or not layer.built
        or _needs_call_machinery(layer)
        or not _ready(layer, args)
    ):
        return layer(*args, training=training, **kwargs)
    if _is_dropout(layer):
        return args[0]
    if training is not None and getattr(layer, "_call_has_training_arg", 0):
        kwargs["training"] = training
    return layer.call(*args, **kwargs)


def _needs_call_machinery(layer) -> bool:
    policy = layer.dtype_policy
    return (
        policy.quantization_mode is not None
        or policy.compute_dtype != policy.variable_dtype
    )


def _ready(layer, args) -> bool:
    """Every input is a backend tensor, floats in the compute dtype."""
    for leaf in keras.tree.flatten(args):
        if not keras.ops.is_tensor(leaf):
            return False
        dtype = keras.backend.standardize_dtype(leaf.dtype)
        if "float" in dtype and dtype != layer.compute_dtype:
            return False
    return True


def _is_dropout(layer) -> bool:
    return isinstance(layer, keras.layers.Dropout)
