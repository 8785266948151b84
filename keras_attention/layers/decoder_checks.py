"""Input checks of the two decoders, `TransformerDecoderBlock` and
`AttentionDecoder`: their source, its masks, caches and segments, and the
RNN decoder's arguments and step state. Clear `ValueError`s, written once.
"""

import copy

import keras
import numpy as np

from keras_attention import _core
from keras_attention._core.checks import positive_integer
from keras_attention.layers import checks
from keras_attention.layers.attention_mechanism import AttentionMechanism
from keras_attention.layers.luong_attention import LuongAttention

FLOWS = ("bahdanau", "luong")


def check_encoder_outputs_shape(
    where, inputs_shape, encoder_outputs_shape, inputs_form="(B, T, D)"
):
    """A decoder's `inputs` (of `inputs_form`) and `encoder_outputs`
    `(B, S, De)` are of rank 3 and share the batch."""
    batch, source_batch = inputs_shape[0], encoder_outputs_shape[0]
    if (
        len(inputs_shape) != 3
        or len(encoder_outputs_shape) != 3
        or None not in (batch, source_batch)
        and batch != source_batch
    ):
        raise ValueError(
            f"{where}: `inputs` must be {inputs_form} and `encoder_outputs` "
            "(B, S, De), with the same B. Received: "
            f"inputs.shape={tuple(inputs_shape)}, "
            f"encoder_outputs.shape={tuple(encoder_outputs_shape)}"
        )


def check_source(
    where,
    has_cross,
    encoder_outputs,
    cross_cache,
    padding_mask,
    attention_mask=None,
    length=None,
):
    """A decoder block's source (`encoder_outputs` or its projected
    `cross_cache`) is given exactly when the block has cross-attention,
    and its masks fit it: `padding_mask` (the `encoder_padding_mask`
    `(B, S)`) and `attention_mask` (the `encoder_attention_mask` `(B, T,
    S)` of `length` target positions, or a shape that broadcasts to it).
    """
    has_source = encoder_outputs is not None or cross_cache is not None
    for name, mask in (
        ("encoder_padding_mask", padding_mask),
        ("encoder_attention_mask", attention_mask),
    ):
        if mask is not None and not has_source:
            raise ValueError(
                f"{where}: `{name}` needs `encoder_outputs` (or a cache "
                "with 'cross'). Received: encoder_outputs=None, "
                f"{name}.shape={tuple(mask.shape)}"
            )
    if encoder_outputs is not None and cross_cache is not None:
        checks.check_cache_source(
            where,
            cross_cache,
            "cache['cross']",
            encoder_outputs=encoder_outputs,
        )
    if has_source:
        source = (
            tuple(encoder_outputs.shape)[:2]
            if encoder_outputs is not None
            else (cross_cache.shape[0], cross_cache.shape[2])
        )  # (B, S)
        if encoder_outputs is not None:
            checks.check_mask(
                where, "encoder_padding_mask", padding_mask, source
            )
        checks.check_attention_mask(
            where,
            "encoder_attention_mask",
            attention_mask,
            (source[0], length, source[1]),
        )
    if has_source != has_cross:
        built, must = ("with", "") if has_cross else ("without", "not ")
        given = "None" if encoder_outputs is None else "a tensor"
        raise ValueError(
            f"{where}: the block was built {built} cross-attention (by its "
            "first call), so `encoder_outputs` (or a cache with 'cross') "
            f"must {must}be given. Received: encoder_outputs={given}"
        )


def cross_segment_ids(
    where, inputs, segment_ids, encoder_segment_ids, source, cross_cache
):
    """`(segment_ids, encoder_segment_ids)` for a decoder block's
    cross-attention over `source` (or its `cross_cache`), checked, or
    `None` without `encoder_segment_ids`."""
    if encoder_segment_ids is None:
        return None
    if segment_ids is None:
        raise ValueError(
            f"{where}: `encoder_segment_ids` needs the target's "
            "`segment_ids` (which source sequence each target token belongs "
            "to). Received: segment_ids=None"
        )
    if source is None and cross_cache is None:
        raise ValueError(
            f"{where}: `encoder_segment_ids` needs `encoder_outputs` (or a "
            "cache with 'cross'). Received: encoder_outputs=None"
        )
    source_length = (
        source.shape[1] if source is not None else cross_cache.shape[2]
    )
    segments = (segment_ids, encoder_segment_ids)
    _core.Structure.from_args(
        where=where,
        batch=inputs.shape[0],
        query_length=inputs.shape[1],
        key_length=source_length,
        segment_ids=segments,
    )  # checks both
    return segments


def check_init_cache(where, built, batch_size, max_length, dtype):
    """`init_cache` of a `built` block: its sizes and its floating-point
    `dtype` (or `None`)."""
    if not built:
        raise ValueError(
            f"{where}: call or build the block before `init_cache`, so that "
            "its head sizes are known. Received: an unbuilt block"
        )
    if not hasattr(batch_size, "shape"):  # a traced batch is no int
        positive_integer(where, "batch_size", batch_size)
    checks.check_positive_int(where, "max_length", max_length)
    if dtype is not None and "float" not in keras.backend.standardize_dtype(
        dtype
    ):
        raise ValueError(
            f"{where}: `dtype` must be a floating-point dtype. "
            f"Received: dtype={dtype!r}"
        )


def check_cache_source_shape(where, encoder_outputs, batch_size, feature_dim):
    """`encoder_outputs` for `init_cache`: `(batch_size, S, De)`, with the
    `feature_dim` De the block was built with (where known)."""
    shape = tuple(encoder_outputs.shape)
    batch = checks.static_dim(shape[0]) if shape else None
    if len(shape) != 3 or (
        batch is not None
        and isinstance(batch_size, (int, np.integer))
        and batch != batch_size
    ):
        raise ValueError(
            f"{where}: `encoder_outputs` must be (B, S, De) with "
            f"B = batch_size = {batch_size}. Received: "
            f"encoder_outputs.shape={shape}"
        )
    if feature_dim is not None:
        checks.check_built_dim(
            where, "encoder_outputs", encoder_outputs, feature_dim
        )


def decoder_arguments(
    where, cell, attention, flow, attention_dim, input_feeding, activation
):
    """`AttentionDecoder`'s constructor arguments, checked: returns the
    cell and the attention (deserialized when given as configs), the flow
    (its default for `attention` when `None`) and the activation of the
    Luong flow's attentional layer (`activation`) as a function."""
    # Copies: a config's `from_config` may consume it (StackedRNNCells
    # pops its cells), and the caller's dict must stay whole.
    if isinstance(cell, dict):
        cell = keras.layers.deserialize(copy.deepcopy(cell))
    if isinstance(attention, dict):
        attention = keras.layers.deserialize(copy.deepcopy(attention))
    if not hasattr(cell, "state_size") or not callable(cell):
        raise ValueError(
            f"{where}: `cell` must be a Keras RNN cell such as "
            f"keras.layers.GRUCell. Received: cell={cell!r}"
        )
    if not isinstance(attention, AttentionMechanism):
        raise ValueError(
            f"{where}: `attention` must be an AttentionMechanism such as "
            f"BahdanauAttention. Received: attention={attention!r}"
        )
    if getattr(cell, "dropout", 0) or getattr(cell, "recurrent_dropout", 0):
        raise ValueError(
            f"{where}: cell dropout is not supported inside the decoding "
            "loop; apply Dropout to the decoder inputs or outputs. "
            f"Received: cell.dropout={cell.dropout}, "
            f"cell.recurrent_dropout={cell.recurrent_dropout}"
        )
    if flow is None:
        flow = "luong" if isinstance(attention, LuongAttention) else "bahdanau"
    if flow not in FLOWS:
        raise ValueError(
            f"{where}: `flow` must be one of {FLOWS}. Received: flow={flow!r}"
        )
    checks.check_positive_int(where, "attention_dim", attention_dim, True)
    if attention_dim is not None and flow == "bahdanau":
        raise ValueError(
            f"{where}: `attention_dim` sizes the Luong flow's attentional "
            "state; the Bahdanau flow outputs the cell's state. Received: "
            f"attention_dim={attention_dim}, flow='bahdanau'"
        )
    checks.check_flag(where, "input_feeding", input_feeding)
    return cell, attention, flow, _attention_activation(where, flow, activation)


def _attention_activation(where, flow, activation):
    """The Luong flow's `attention_activation` as a Keras activation; the
    Bahdanau flow takes only the default."""
    try:
        function = keras.activations.get(activation)
    except (ValueError, TypeError):
        function = None
    if function is None or not callable(function):
        raise ValueError(
            f"{where}: `attention_activation` must be a Keras activation "
            "(a name such as 'tanh', or a function) or None. Received: "
            f"attention_activation={activation!r}"
        )
    if flow == "bahdanau" and function is not keras.activations.tanh:
        raise ValueError(
            f"{where}: `attention_activation` is the Luong flow's "
            "attentional layer's; the Bahdanau flow outputs the cell's "
            f"state. Received: attention_activation={activation!r}, "
            "flow='bahdanau'"
        )
    return function


def check_decoder_inputs(where, name, inputs, encoder_outputs, built):
    """`AttentionDecoder`'s `inputs` `(B, T, E)` (or one step's `inputs_t`
    `(B, E)`) and `encoder_outputs` `(B, S, De)` share the batch and have
    the feature sizes `built` `(E, De)` the decoder was built with."""
    rank, form = (
        (2, "(B, E), one step") if name == "inputs_t" else (3, "(B, T, E)")
    )
    if len(inputs.shape) != rank:
        raise ValueError(
            f"{where}: `{name}` must be {form}. "
            f"Received: {name}.shape={tuple(inputs.shape)}"
        )
    if len(encoder_outputs.shape) != 3:
        raise ValueError(
            f"{where}: `encoder_outputs` must be (B, S, De). Received: "
            f"encoder_outputs.shape={tuple(encoder_outputs.shape)}"
        )
    given = (inputs.shape[-1], encoder_outputs.shape[-1])
    if not all(map(same_dim, built, given)) or not same_dim(
        inputs.shape[0], encoder_outputs.shape[0]
    ):
        raise ValueError(
            f"{where}: `{name}` and `encoder_outputs` must share the batch "
            f"and have the sizes it was built with (E={built[0]}, "
            f"De={built[1]}). Received: {name}.shape={tuple(inputs.shape)}, "
            f"encoder_outputs.shape={tuple(encoder_outputs.shape)}"
        )


def check_cell_states(where, name, states, sizes, encoder_outputs):
    """`states`, a flat list, are a cell's: one `(B, size)` tensor per
    state size in `sizes`, with the batch of `encoder_outputs`."""
    if len(states) != len(sizes) or any(
        len(getattr(s, "shape", ())) != 2
        or s.shape[-1] not in (None, size)
        or not same_dim(s.shape[0], encoder_outputs.shape[0])
        for s, size in zip(states, sizes, strict=False)
    ):
        raise ValueError(
            f"{where}: `{name}` must be {len(sizes)} tensor(s) (B, size) of "
            f"sizes {sizes}, with the batch of `encoder_outputs` "
            f"{tuple(encoder_outputs.shape)}. Received: {name} shapes "
            f"{[tuple(getattr(s, 'shape', ())) for s in states]}"
        )


def check_step_state(where, state, encoder_outputs, sizes, feed_dim, attention):
    """A `state` given to `AttentionDecoder.step` is one its
    `get_initial_state` or `step` made for these `encoder_outputs`: cell
    states of `sizes`, the projected keys, with input feeding (`feed_dim`
    not `None`) the previous attentional output, and the state of an
    `attention` with memory."""
    required = ["cell", "keys"] + (["feed"] if feed_dim is not None else [])
    if not isinstance(state, dict) or not set(required) <= set(state):
        received = type(state).__name__
        if isinstance(state, dict):
            missing = [key for key in required if key not in state]
            received = f"a dict without {missing} (keys {sorted(state)})"
        raise ValueError(
            f"{where}: `state` must be the dict of `get_initial_state` or "
            f"of the previous step, with keys {required}. Received: "
            f"{received}"
        )
    check_cell_states(
        where,
        "state['cell']",
        keras.tree.flatten(state["cell"]),
        sizes,
        encoder_outputs,
    )
    keys = state["keys"]
    if len(keys.shape) != 3 or not all(
        map(same_dim, keys.shape[:2], encoder_outputs.shape[:2])
    ):
        raise ValueError(
            f"{where}: `state['keys']` must be the keys `get_initial_state` "
            f"projected from these `encoder_outputs` "
            f"{tuple(encoder_outputs.shape)}: (B, S, units). Received: "
            f"state['keys'].shape={tuple(keys.shape)}"
        )
    feed = state.get("feed")
    if feed_dim is not None and (
        len(feed.shape) != 2
        or not same_dim(feed.shape[0], encoder_outputs.shape[0])
        or feed.shape[-1] not in (None, feed_dim)
    ):
        raise ValueError(
            f"{where}: `state['feed']` must be the previous attentional "
            f"output (B, {feed_dim}). Received: "
            f"state['feed'].shape={tuple(feed.shape)}"
        )
    if attention.attention_state_names and state.get("attention") is None:
        raise ValueError(
            f"{where}: `state` must hold the attention's state under "
            "'attention' (start from `get_initial_state`): "
            f"{type(attention).__name__} reads its previous alignment. "
            f"Received: state with keys {sorted(state)}"
        )


def same_dim(a, b):
    """Whether two dims may be equal (an unknown one may be anything)."""
    if a is None or b is None:
        return True
    a, b = checks.static_dim(a), checks.static_dim(b)
    return a is None or b is None or a == b
