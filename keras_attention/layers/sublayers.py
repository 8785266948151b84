"""Creating and calling a layer's own sublayers.

`fresh` gives each weight its own copy of an initializer;
`built_projection` makes a bias-free score projection. `call_leaf`
calls a built leaf sublayer (a projection, a norm, a dropout) without
Keras's per-call bookkeeping. `policy_for` and `dtype_config` carry
per-sublayer dtype policies (quantized projections) through a layer's
config; `enable_lora` adds LoRA adapters to chosen projections.
`gelu_approximate` is the tanh GELU of the blocks converted from
keras-hub, registered here so that they load without keras-hub.
"""

import keras
import numpy as np

# The Keras layers `call_leaf` takes: one tensor in, no sublayers, and no
# call argument that `__call__` fills in (a `mask`) or that matters in
# inference (`training`: Dropout is the identity, the others ignore it).
LEAVES = (
    keras.layers.Dense,
    keras.layers.EinsumDense,
    keras.layers.LayerNormalization,
    keras.layers.RMSNormalization,
    keras.layers.Dropout,
)


@keras.saving.register_keras_serializable(package="keras_attention")
def gelu_approximate(x):
    """GELU with the tanh approximation (GPT-2, BERT), keras-hub's
    `gelu_approximate` under our name: a block's config refers to it as
    `keras_attention>gelu_approximate`, which loads wherever
    `keras_attention` is imported, keras-hub or not.

    Args:
        x (Tensor): Any shape.

    Returns:
        Tensor: `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`.
    """
    return keras.activations.gelu(x, approximate=True)


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


def built_projection(layer, name, units, input_dim):
    """`layer`'s bias-free `Dense` sublayer `name`: `input_dim -> units`,
    with a fresh copy of `layer.kernel_initializer` and the sublayer's
    dtype policy, built for inputs `(B, T, input_dim)` (the RNN
    mechanisms' score projections)."""
    dense = keras.layers.Dense(
        units,
        use_bias=False,
        kernel_initializer=fresh(layer.kernel_initializer),
        dtype=policy_for(layer, name),
        name=name,
    )
    dense.build((None, None, input_dim))
    return dense


def call_dense(layer, inputs):
    """`call_leaf(layer, inputs)` for a `Dense` over the last axis.

    On TensorFlow, inputs of three or more axes are folded into a matrix
    first: Keras's `Dense` is a `tensordot` there, and inside a loop with
    an unknown batch (an RNN decoder's scan, compiled for a last batch of
    another size) XLA cannot compile its gradient. Other backends take the
    axes as they are (a reshape of symbolic sizes would not export to
    ONNX from JAX).
    """
    if keras.backend.backend() != "tensorflow" or len(inputs.shape) <= 2:
        return call_leaf(layer, inputs)
    leading = keras.ops.shape(inputs)[:-1]  # static where known
    flat = keras.ops.reshape(inputs, (-1, inputs.shape[-1]))
    projected = call_leaf(layer, flat)  # (..., U) as a matrix
    return keras.ops.reshape(projected, (*leading, projected.shape[-1]))


def call_leaf(layer, inputs, training=None):
    """`layer(inputs, training=training)` for a leaf sublayer, cheaply.

    `Layer.__call__` converts inputs, opens name and autocast scopes,
    fills in `training` and implicit masks and attaches output masks.
    For a built leaf of `LEAVES` in inference none of that changes the
    result when its variables are in its compute dtype and its input is
    a tensor of that dtype (the outer layer has resolved masks and
    `training` already), so this calls `layer.call(inputs)`, and a
    `Dropout` is the identity. It goes through `__call__` in training,
    for a layer not yet built, under mixed precision (autocasting), for
    a quantized layer, and for inputs that are not yet tensors of the
    compute dtype (NumPy arrays given to a public method such as
    `compute_cache`). It reads only public attributes; containers (the
    attention layers, a user's RNN cell) are always called normally.

    Why: a cached one-token decoding step does little arithmetic, and on
    an eager backend `__call__` costs more than a projection's. On
    PyTorch (CPU, one thread, the fastest of 15 rounds of 100 steps) a
    step of a decoder-only `TransformerDecoderBlock` (D = 256, 4 heads,
    feed-forward 1024, a cache of 128, pre-LN) took 5.7 ms with every
    sublayer through `__call__` and 3.6 ms with its leaves through
    `call_leaf` (2.6 ms when the attention layers inside it were
    bypassed too, as release 0.1.0 did).

    Args:
        layer (keras.layers.Layer): One of `LEAVES`, exactly.
        inputs (Tensor): Its input.
        training (bool | None): Whether dropout is active.

    Returns:
        Tensor: `layer(inputs, training=training)`.
    """
    if type(layer) not in LEAVES:
        raise TypeError(
            "call_leaf takes a built-in leaf layer "
            f"({', '.join(c.__name__ for c in LEAVES)}); call others "
            f"normally. Received: {type(layer).__name__}"
        )
    if (
        training
        or not layer.built
        or _needs_call_machinery(layer)
        or not _ready(layer, inputs)
    ):
        return layer(inputs, training=training)
    if type(layer) is keras.layers.Dropout:
        return inputs
    return layer.call(inputs)


def _needs_call_machinery(layer) -> bool:
    # The path-aware properties: a `DTypePolicyMap` reports its default.
    return (
        layer.quantization_mode is not None
        or layer.compute_dtype != layer.variable_dtype
    )


def _ready(layer, inputs) -> bool:
    """The input is a backend tensor, a float one in the compute dtype."""
    if not keras.ops.is_tensor(inputs):
        return False
    dtype = keras.backend.standardize_dtype(inputs.dtype)
    return "float" not in dtype or dtype == layer.compute_dtype


def policy_for(layer, name):
    """The dtype policy for `layer`'s sublayer `name`.

    A layer re-creates its sublayers from its own config, so a quantized
    projection would come back in float. `dtype_config` saves the
    quantized sublayers' policies in a `DTypePolicyMap` keyed by their
    path below the layer (`"self_attention/query_dense"`); this resolves
    it here, once, so that sublayers hold concrete policies (Keras's own
    quantized code paths read `layer.dtype_policy.quantization_mode`).
    A nested container gets the part of the map below its name. A map
    keyed by absolute paths (a model-level map, as keras-hub writes) is
    resolved by the sublayer's path when it is known (in `build`, where
    sublayers are made), and passed on to a container with entries below
    it (or when the path is not known), whose own sublayers resolve
    their paths.
    """
    policy = layer.dtype_policy
    if not isinstance(policy, keras.dtype_policies.DTypePolicyMap):
        return policy
    entries = {key: policy[key] for key in policy}
    if name in entries:
        return entries[name]
    prefix = f"{name}/"
    nested = {
        key[len(prefix) :]: value
        for key, value in entries.items()
        if key.startswith(prefix)
    }
    if nested:
        return keras.dtype_policies.DTypePolicyMap(
            policy.default_policy, {**entries, **nested}
        )
    if not layer.path:
        return policy
    path = f"{layer.path}/{name}"  # in `build`: the sublayer's path
    if any(key.startswith(f"{path}/") for key in entries):
        return policy
    return policy[path]


def dtype_config(layer, config):
    """`config` with `dtype` a map of the quantized sublayers' policies.

    Unchanged when no sublayer is quantized.
    """
    entries = dict(_quantized_policies(layer, ""))
    if entries:
        policy = layer.dtype_policy
        if isinstance(policy, keras.dtype_policies.DTypePolicyMap):
            policy = policy.default_policy
        config["dtype"] = keras.dtype_policies.serialize(
            keras.dtype_policies.DTypePolicyMap(policy, entries)
        )
    return config


def _quantized_policies(layer, prefix):
    for sublayer in layer._flatten_layers(include_self=False, recursive=False):
        path = f"{prefix}{sublayer.name}"
        if sublayer.quantization_mode is not None:
            policy = sublayer.dtype_policy
            if isinstance(policy, keras.dtype_policies.DTypePolicyMap):
                policy = policy[sublayer.path]
            yield path, policy
        yield from _quantized_policies(sublayer, f"{path}/")


def add_lora(
    layer,
    projections,
    rank,
    lora_alpha,
    a_initializer,
    b_initializer,
    targets,
):
    """LoRA (Hu et al., 2021) on `layer`'s projections named in `targets`.

    `projections` maps each name a user may target to the `Dense` /
    `EinsumDense` sublayers it stands for. Every other weight of `layer`
    is frozen, so the adapters are its only trainable weights.
    """
    where = layer._where()
    if not layer.built:
        raise ValueError(
            f"{where}: `enable_lora` needs a built layer (call it once or "
            "call `build`). Received: an unbuilt layer"
        )
    if not projections:
        raise ValueError(
            f"{where}: the layer has no projections for LoRA to adapt "
            "(Luong's dot score has no weights). Received: "
            f"targets={targets!r} on a layer with none"
        )
    if not (isinstance(rank, int) and not isinstance(rank, bool) and rank > 0):
        raise ValueError(
            f"{where}: `rank` must be a positive integer. "
            f"Received: rank={rank!r}"
        )
    if lora_alpha is not None and (
        isinstance(lora_alpha, bool)
        or not isinstance(lora_alpha, (int, float))
        or lora_alpha <= 0
    ):
        raise ValueError(
            f"{where}: `lora_alpha` must be a positive number or None. "
            f"Received: lora_alpha={lora_alpha!r}"
        )
    if isinstance(targets, str):
        targets = (targets,)
    targets = tuple(targets)
    unknown = [name for name in targets if name not in projections]
    if not targets or unknown:
        raise ValueError(
            f"{where}: `targets` must be a non-empty list of "
            f"{sorted(projections)}. Received: targets={targets!r}"
        )
    chosen = [sub for name in targets for sub in projections[name]]
    if any(getattr(sub, "lora_enabled", False) for sub in chosen):
        raise ValueError(
            f"{where}: LoRA is already enabled on these projections; it "
            f"can be enabled once. Received: targets={targets!r}"
        )
    adapters = set()
    for sub in chosen:
        sub.enable_lora(
            rank,
            lora_alpha=lora_alpha,
            a_initializer=fresh(keras.initializers.get(a_initializer)),
            b_initializer=fresh(keras.initializers.get(b_initializer)),
        )
        adapters.update(id(v) for v in (sub.lora_kernel_a, sub.lora_kernel_b))
    for variable in layer.variables:
        if id(variable) not in adapters:
            variable.trainable = False
    retrack(layer)


def dense_projections(layer) -> dict:
    """`layer`'s `Dense` / `EinsumDense` sublayers at any depth, by name:
    what `enable_lora` may target in a layer without fixed names."""
    projections = {}
    for sublayer in layer._flatten_layers(include_self=False):
        if type(sublayer) in (keras.layers.Dense, keras.layers.EinsumDense):
            projections.setdefault(sublayer.name, []).append(sublayer)
    return projections


def retrack(layer):
    """Refreshes the variables PyTorch tracks after weights changed.

    On the torch backend each layer keeps a `ParameterDict` of its
    variables, made at build time; Keras's `Model.quantize` refreshes it
    for a whole model, a layer's own `enable_lora` does not.
    """
    if keras.backend.backend() == "torch":
        for sublayer in layer._flatten_layers():
            sublayer._track_variables()


def lora_variables(layer) -> dict:
    """`layer`'s LoRA adapters, keyed `"<i>.<projection>/<adapter>"`: the
    i-th adapted projection in the layer's fixed order of sublayers, so
    the keys do not depend on names Keras made up (a user's mechanism in
    an `AttentionDecoder`) and a layer of another name loads them."""
    adapted = [
        sublayer
        for sublayer in layer._flatten_layers()
        if getattr(sublayer, "lora_enabled", False)
    ]
    return {
        f"{i}.{sublayer.name}/{variable.name}": variable
        for i, sublayer in enumerate(adapted)
        for variable in (sublayer.lora_kernel_a, sublayer.lora_kernel_b)
    }


def save_lora_weights(layer, filepath):
    """Writes `layer`'s LoRA adapters (and nothing else) to `filepath`."""
    adapters = lora_variables(layer)
    if not adapters:
        raise ValueError(
            f"{layer._where()}: `save_lora_weights` needs LoRA enabled "
            "(call `enable_lora` first). Received: a layer without LoRA"
        )
    values = {
        path: keras.ops.convert_to_numpy(variable)
        for path, variable in adapters.items()
    }
    with open(filepath, "wb") as file:
        np.savez(file, **values)


def load_lora_weights(layer, filepath):
    """Sets `layer`'s LoRA adapters from a `save_lora_weights` file."""
    where = layer._where()
    adapters = lora_variables(layer)
    with np.load(filepath) as stored:
        values = {path: stored[path] for path in stored.files}
    if sorted(values) != sorted(adapters):
        raise ValueError(
            f"{where}: the file's adapters are not this layer's; enable "
            "LoRA with the same `targets` first. Received: adapters "
            f"{sorted(values)} for a layer with {sorted(adapters)}"
        )
    for path, variable in adapters.items():
        if tuple(values[path].shape) != tuple(variable.shape):
            raise ValueError(
                f"{where}: adapter '{path}' has shape {variable.shape}; "
                "enable LoRA with the saved `rank`. Received: shape "
                f"{values[path].shape}"
            )
    for path, variable in adapters.items():
        variable.assign(values[path])


class LoraMixin:
    """LoRA (Hu et al., 2021) on a layer's projections: its `Dense` and
    `EinsumDense` sublayers, at any depth, by name. A layer sets
    `_default_lora_targets` (`None`: every projection)."""

    _default_lora_targets = None

    def enable_lora(
        self,
        rank: int,
        lora_alpha: float | None = None,
        a_initializer: str | keras.initializers.Initializer = "he_uniform",
        b_initializer: str | keras.initializers.Initializer = "zeros",
        targets: str | list[str] | tuple[str, ...] | None = None,
    ) -> None:
        """Adds LoRA adapters to projections and freezes everything else.

        LoRA (Hu et al., 2021) learns a low-rank update of a frozen
        kernel, $W + \\frac{\\alpha}{r} A B$, for each projection named
        in `targets`, through Keras's `Dense` / `EinsumDense`
        `enable_lora`. A name covers every projection of that name in
        the layer: in a decoder block, `"query_dense"` adapts the self-
        and the cross-attention's. The names are `"query_dense"`,
        `"key_dense"`, `"value_dense"`, `"output_dense"` in the
        multi-head layers, also `"feedforward_intermediate_dense"` and
        `"feedforward_output_dense"` in the blocks; `"query_dense"`,
        `"key_dense"` (`"location_dense"`, `"attention_projection"`) in
        the RNN attention layers and `AttentionDecoder` (Luong's dot
        score has none; an RNN cell's kernels have no LoRA in Keras).
        For the query kernel `(D, N, H)`, $A$ is `(D, N, r)` and $B$
        `(r, H)`, shared by the heads; for the output kernel
        `(N, H, D)`, $A$ is `(N, H, r)` and $B$ `(r, D)`. Every other
        weight of the layer becomes non-trainable, so
        `trainable_weights` are the adapters.

        Saving (`.keras`, `save_weights`) stores the merged kernels (in an
        int8 layer, merging re-quantizes the kernel, so its outputs move
        by the quantization error); `save_lora_weights` stores the
        adapters alone. On PyTorch a `keras.Model` lists its torch
        parameters when it is built, so a model built before
        `enable_lora` lacks the adapters in `model.parameters()` (Keras's
        `fit` reads `model.trainable_variables`, which has them): for a
        plain torch loop, enable LoRA before making the model.

        Args:
            rank: The rank $r$ of the update.
            lora_alpha: The scale $\\alpha$. Defaults to `rank`.
            a_initializer: Initializer of $A$. Defaults to `"he_uniform"`.
            b_initializer: Initializer of $B$. Defaults to `"zeros"`, so
                the layer starts from the frozen kernel's outputs.
            targets: The projection name, or names, to adapt.
                Defaults to `("query_dense", "value_dense")` in the
                multi-head layers and blocks (as in the paper and
                keras-hub's `Backbone.enable_lora`), to every projection
                in the RNN attention layers and `AttentionDecoder`.

        Examples:
            >>> import keras_attention as ka
            >>> block = ka.TransformerEncoderBlock(2, 16)
            >>> block.build((None, None, 8))
            >>> block.enable_lora(rank=4)
            >>> sorted({w.name for w in block.trainable_weights})
            ['lora_kernel_a', 'lora_kernel_b']
            >>> len(block.trainable_weights)  # query and value, A and B
            4

        References:
            - [Hu et al., 2021](https://arxiv.org/abs/2106.09685)
        """
        projections = dense_projections(self)
        if targets is None:
            targets = self._default_lora_targets or tuple(projections)
        add_lora(
            self,
            projections,
            rank,
            lora_alpha,
            a_initializer,
            b_initializer,
            targets,
        )

    def save_lora_weights(self, filepath: str) -> None:
        """Writes the LoRA adapters, and nothing else, to `filepath`.

        A small NumPy `.npz` file keyed by each adapted projection's
        place in this layer (`"0.query_dense/lora_kernel_a"`), so it
        loads into another layer built the same way, whatever its name.
        Pair it with the base model's own weights; `.keras` files store
        merged kernels.

        Args:
            filepath: Where to write.
        """
        save_lora_weights(self, filepath)

    def load_lora_weights(self, filepath: str) -> None:
        """Sets the LoRA adapters from a `save_lora_weights` file.

        Enable LoRA first with the `rank` and `targets` they were saved
        with; a different set of adapters or shape raises a `ValueError`.

        Args:
            filepath: A file written by `save_lora_weights`.
        """
        load_lora_weights(self, filepath)
