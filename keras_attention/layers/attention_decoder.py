"""An RNN decoder with attention over the encoder states (Bahdanau et
al. 2015; Luong et al. 2015).

Shape legend: B batch, T target steps, S source length, E decoder input dim,
De encoder dim, U cell units, A attentional state dim.
"""

import copy

import keras
from keras import ops

from keras_attention import _kernels
from keras_attention.layers import checks
from keras_attention.layers.attention_mechanism import AttentionMechanism
from keras_attention.layers.luong_attention import LuongAttention
from keras_attention.layers.sublayers import LoraMixin
from keras_attention.layers.sublayers import call_leaf
from keras_attention.layers.sublayers import dtype_config
from keras_attention.layers.sublayers import policy_for

_FLOWS = ("bahdanau", "luong")


@keras.saving.register_keras_serializable(package="keras_attention")
class AttentionDecoder(LoraMixin, keras.layers.Layer):
    """Runs a Keras RNN cell over the target with attention at every step.

    The fix for the encoder bottleneck (Bahdanau et al. 2015): instead of
    one fixed context vector, every decoding step builds its own context
    $c_t$ from all encoder states $h_j$. Two flows are implemented.

    `flow="bahdanau"` ("previous state"): score with the previous state,
    then step the cell on the previous token and the context:

    $$c_t = \\sum_j \\alpha_{t,j} h_j,\\ \\alpha_t = \\operatorname{softmax}
    (\\operatorname{score}(s_{t-1}, h)),\\quad s_t = \\operatorname{RNN}
    ([y_{t-1}; c_t], s_{t-1})$$

    and the output is $s_t$. `flow="luong"` ("current state"): step the
    cell first, score with the new state, and combine:

    $$s_t = \\operatorname{RNN}([y_{t-1}; \\tilde s_{t-1}], s_{t-1}),\\
    c_t = \\sum_j \\alpha_{t,j} h_j,\\ \\alpha_t = \\operatorname{softmax}
    (\\operatorname{score}(s_t, h)),\\quad \\tilde s_t = \\tanh(W_c [c_t;
    s_t])$$

    and the output is the attentional state $\\tilde s_t$ (of size
    `attention_dim`), fed to the next step's input when `input_feeding`.
    With `attention_activation=None` the attentional layer is linear,
    $\\tilde s_t = W_c [c_t; s_t]$, as in tensorflow-addons'
    `AttentionWrapper(..., attention_layer_size=A)`, whose trained weights
    then give the same outputs (its $W_c$ takes $[s_t; c_t]$: swap the two
    row blocks).

    The teacher-forced loop is a `keras.ops.scan`, so it compiles with the
    rest of the model; the attention's key projections are computed once
    per source sequence. The attention's `dropout` (and the score noise of
    `MonotonicAttention`) acts in training: its masks, one per step, are
    drawn before the loop, as Keras's RNN layers draw theirs, so training
    also compiles on JAX. Cell dropout is not
    supported; put `Dropout` on the decoder's inputs and outputs. For
    step-by-step inference use `get_initial_state` and `step`, which
    `keras_attention.decoding` drives.

    `Model.quantize("int8")` quantizes $W_c$ and the attention's
    projections; the RNN cell's kernels are not quantizable in Keras
    (its cells have no `quantize`) and stay in the variable dtype.

    Args:
        cell (keras.layers.Layer): A Keras RNN cell (`GRUCell`, `LSTMCell`,
            `SimpleRNNCell`, ...), or several as `StackedRNNCells`: the
            Bahdanau flow then scores with the first cell's previous
            output, as GNMT does (Wu et al. 2016), and the decoder outputs
            the last cell's.
        attention (AttentionMechanism): A `BahdanauAttention`,
            `LuongAttention`, `LocationSensitiveAttention` or
            `MonotonicAttention`. Attention that reads its previous
            alignment keeps it in the decoder's state.
        flow: `"bahdanau"` or `"luong"`. Defaults to `"luong"` for a
            `LuongAttention` and `"bahdanau"` otherwise.
        attention_dim: Size A of $\\tilde s_t$ in the Luong flow (the
            Bahdanau flow has no such projection). Defaults to the cell's
            output size.
        input_feeding: Luong flow: feed $\\tilde s_{t-1}$ with the input.
            Defaults to `True`.
        attention_activation: Luong flow: the activation of the attentional
            layer, a Keras activation (name or function), or `None` for
            the linear layer of tensorflow-addons' `AttentionWrapper`.
            Defaults to `"tanh"` (Luong et al. 2015).
        **kwargs (Any): Base `keras.layers.Layer` arguments (`name`, `dtype`,
            ...).

    Other Parameters: Call arguments:
        inputs (Tensor): Shape `(B, T, E)`, the embedded previous target tokens
            $y_{t-1}$ (teacher forcing).
        encoder_outputs (Tensor): Shape `(B, S, De)`, the states $h_j$.
        encoder_padding_mask (Tensor): Shape `(B, S)`, boolean. Defaults to the
            Keras mask of `encoder_outputs`.
        mask (Tensor): Shape `(B, T)`, boolean: the Keras mask of `inputs`
            (from `Embedding(mask_zero=True)`, say), filled in by Keras. As
            in Keras's RNN layers, a masked step keeps the state and
            repeats the previous output (its alignment row is zeros), so
            padding before or after the tokens leaves the real steps'
            outputs unchanged.
        initial_state (list[Tensor] | None): Cell states, e.g. the encoder's
            final state. Defaults to zeros.
        return_attention_scores (bool): Also return the alignment history
            `(B, T, S)`.
        training (bool): Whether the attention's dropout is active.

    Returns:
        Tensor | tuple[Tensor, Tensor]: The outputs, `(B, T, U)` (Bahdanau)
            or `(B, T, A)` (Luong), and with `return_attention_scores=True`
            the alignments `(B, T, S)`.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> from keras_attention import BahdanauAttention
        >>> decoder = AttentionDecoder(
        ...     keras.layers.GRUCell(16), BahdanauAttention(units=8)
        ... )
        >>> targets = np.random.rand(2, 5, 4).astype("float32")
        >>> encoded = np.random.rand(2, 7, 12).astype("float32")
        >>> out, alignment = decoder(
        ...     targets, encoded, return_attention_scores=True
        ... )
        >>> tuple(out.shape), tuple(alignment.shape)
        ((2, 5, 16), (2, 5, 7))

    References:
        Bahdanau, Cho and Bengio, 2015; Luong, Pham and Manning, 2015.
    """

    def __init__(
        self,
        cell,
        attention,
        flow: str | None = None,
        attention_dim: int | None = None,
        input_feeding: bool = True,
        attention_activation="tanh",
        **kwargs,
    ):
        super().__init__(**kwargs)
        # Copies: a config's `from_config` may consume it (StackedRNNCells
        # pops its cells), and the caller's dict must stay whole.
        if isinstance(cell, dict):
            cell = keras.layers.deserialize(copy.deepcopy(cell))
        if isinstance(attention, dict):
            attention = keras.layers.deserialize(copy.deepcopy(attention))
        where = self._where()
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
            flow = (
                "luong" if isinstance(attention, LuongAttention) else "bahdanau"
            )
        if flow not in _FLOWS:
            raise ValueError(
                f"{where}: `flow` must be one of {_FLOWS}. "
                f"Received: flow={flow!r}"
            )
        if attention_dim is not None and (
            not isinstance(attention_dim, int) or attention_dim < 1
        ):
            raise ValueError(
                f"{where}: `attention_dim` must be a positive integer. "
                f"Received: attention_dim={attention_dim!r}"
            )
        if attention_dim is not None and flow == "bahdanau":
            raise ValueError(
                f"{where}: `attention_dim` sizes the Luong flow's attentional "
                "state; the Bahdanau flow outputs the cell's state. Received: "
                f"attention_dim={attention_dim}, flow='bahdanau'"
            )
        try:
            activation = keras.activations.get(attention_activation)
        except (ValueError, TypeError):
            activation = None
        if activation is None or not callable(activation):
            raise ValueError(
                f"{where}: `attention_activation` must be a Keras activation "
                "(a name such as 'tanh', or a function) or None. Received: "
                f"attention_activation={attention_activation!r}"
            )
        if flow == "bahdanau" and activation is not keras.activations.tanh:
            raise ValueError(
                f"{where}: `attention_activation` is the Luong flow's "
                "attentional layer's; the Bahdanau flow outputs the cell's "
                f"state. Received: attention_activation="
                f"{attention_activation!r}, flow='bahdanau'"
            )
        self.cell = cell
        self.attention = attention
        self.flow = flow
        self.attention_activation = activation
        self.attention_dim = attention_dim
        self.input_feeding = input_feeding
        self.supports_masking = True

    def build(self, inputs_shape, encoder_outputs_shape):
        batch, source_batch = inputs_shape[0], encoder_outputs_shape[0]
        if (
            len(inputs_shape) != 3
            or len(encoder_outputs_shape) != 3
            or None not in (batch, source_batch)
            and batch != source_batch
        ):
            raise ValueError(
                f"{self._where()}: `inputs` must be (B, T, E) and "
                "`encoder_outputs` (B, S, De) with the same B. Received: "
                f"inputs.shape={tuple(inputs_shape)}, "
                f"encoder_outputs.shape={tuple(encoder_outputs_shape)}"
            )
        units = self._cell_output_dim()
        context_dim = encoder_outputs_shape[-1]
        batch = inputs_shape[0]
        self._input_dim, self._context_dim = inputs_shape[-1], context_dim
        if self.flow == "bahdanau":
            cell_input_dim = inputs_shape[-1] + context_dim
        else:
            self._feed_dim = self.attention_dim or units
            cell_input_dim = inputs_shape[-1] + (
                self._feed_dim if self.input_feeding else 0
            )
            self.attention_projection = keras.layers.Dense(
                self._feed_dim,
                activation=self.attention_activation,
                use_bias=False,
                dtype=policy_for(self, "attention_projection"),
                name="attention_projection",
            )
            self.attention_projection.build((batch, context_dim + units))
        # Sublayers restored from a config arrive built.
        if not self.cell.built:
            self.cell.build((batch, cell_input_dim))
        if not self.attention.built:
            query_dim = (
                units if self.flow == "luong" else self._state_sizes()[0]
            )
            self.attention.build((batch, query_dim), encoder_outputs_shape)
        self.built = True

    def call(
        self,
        inputs,
        encoder_outputs,
        encoder_padding_mask=None,
        initial_state=None,
        return_attention_scores: bool = False,
        training=None,
        encoder_outputs_mask=None,
        mask=None,
        inputs_mask=None,
    ):
        if encoder_padding_mask is None:
            encoder_padding_mask = encoder_outputs_mask
        target_mask = mask if mask is not None else inputs_mask
        self._check_inputs("inputs", inputs, encoder_outputs)
        checks.check_mask(
            self._where(), "inputs_mask", target_mask, tuple(inputs.shape[:2])
        )
        checks.check_mask(
            self._where(),
            "encoder_padding_mask",
            encoder_padding_mask,
            tuple(encoder_outputs.shape[:2]),
        )
        state = self.get_initial_state(
            encoder_outputs, encoder_padding_mask, initial_state
        )
        keys = state.pop("keys")  # constant: kept out of the loop carry
        batch, source_length = ops.shape(encoder_outputs)[:2]
        # The step's outputs ride in the carry, which is what is stacked
        # (`scan_carries`: a loop that exports to ONNX from TensorFlow).
        init = {
            **state,
            "output": ops.zeros((batch, self.output_dim), self.compute_dtype),
            "alignment": ops.zeros((batch, source_length), self.compute_dtype),
        }

        steps = {"inputs": ops.transpose(inputs, (1, 0, 2))}  # (T, B, E)
        if target_mask is not None:  # (T, B): padding steps change nothing
            steps["real"] = ops.transpose(ops.cast(target_mask, "bool"))
        if training:
            # Drawn here, not in the loop: a seed drawn inside the scan
            # would leave the trace on JAX.
            length = ops.shape(inputs)[1]
            steps["noise"] = self.attention.draw_loop_noise(
                (length, batch, source_length)
            )  # dropout masks, score noise: (T, B, S) each

        def scan_step(carry, step_inputs):
            previous = carry
            state = {k: carry[k] for k in state_keys}
            output, new_state, alignment = self._step(
                step_inputs["inputs"],
                {**state, "keys": keys},
                encoder_outputs,
                encoder_padding_mask,
                training=training,
                loop_noise=step_inputs.get("noise"),
            )
            new_state.pop("keys")
            carry = {**new_state, "output": output, "alignment": alignment}
            # A loop carry keeps its dtypes: under mixed precision a cell
            # built with another dtype policy may return other floats.
            carry = keras.tree.map_structure(
                lambda new, old: ops.cast(new, old.dtype), carry, init
            )
            if "real" in step_inputs:
                # As Keras's RNN layers: a padding step keeps the state and
                # the previous output; its alignment row is zeros.
                kept = {
                    **previous,
                    "alignment": ops.zeros_like(carry["alignment"]),
                }
                carry = keras.tree.map_structure(
                    lambda new, old: _where_real(step_inputs["real"], new, old),
                    carry,
                    kept,
                )
            return carry

        state_keys = tuple(state)
        stacked = _kernels.scan_carries(scan_step, init, steps)
        outputs = ops.transpose(stacked["output"], (1, 0, 2))  # (B, T, U|A)
        alignments = stacked["alignment"]  # (T, B, S)
        if return_attention_scores:
            return outputs, ops.transpose(alignments, (1, 0, 2))  # (B, T, S)
        return outputs

    def compute_output_shape(self, inputs_shape, encoder_outputs_shape):
        return (inputs_shape[0], inputs_shape[1], self.output_dim)

    def compute_output_spec(
        self,
        inputs,
        encoder_outputs,
        encoder_padding_mask=None,
        initial_state=None,
        return_attention_scores=False,
        training=None,
        encoder_outputs_mask=None,
        mask=None,
        inputs_mask=None,
    ):
        outputs = keras.KerasTensor(
            self.compute_output_shape(inputs.shape, encoder_outputs.shape),
            dtype=self.compute_dtype,
        )
        if not return_attention_scores:
            return outputs
        batch, length = inputs.shape[0], inputs.shape[1]
        alignments = keras.KerasTensor(
            (batch, length, encoder_outputs.shape[1]), dtype=self.compute_dtype
        )
        return outputs, alignments

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "cell": keras.layers.serialize(self.cell),
                "attention": keras.layers.serialize(self.attention),
                "flow": self.flow,
                "attention_dim": self.attention_dim,
                "input_feeding": self.input_feeding,
                "attention_activation": keras.activations.serialize(
                    self.attention_activation
                ),
            }
        )
        return dtype_config(self, config)

    @property
    def output_dim(self) -> int:
        """The size of each output: the cell's output or `attention_dim`."""
        if self.flow == "bahdanau":
            return self._cell_output_dim()
        return self.attention_dim or self._cell_output_dim()

    def get_initial_state(
        self, encoder_outputs, encoder_padding_mask=None, initial_state=None
    ):
        """The decoding state before the first step.

        Projects the attention keys of `encoder_outputs` once; `step` reuses
        them.

        Args:
            encoder_outputs (Tensor): Shape `(B, S, De)`.
            encoder_padding_mask (Tensor | None): Shape `(B, S)`, boolean. Kept
                for the signature's symmetry with `step`; the mask itself
                is passed to `step`.
            initial_state (list[Tensor] | None): Cell states, or `None`
                (zeros). Those of `StackedRNNCells` nested per cell or
                flat.

        Returns:
            dict: Batch-major tensors: `"cell"` (the list of cell states),
                `"keys"` (projected keys `(B, S, U)`), for the Luong flow
                with input feeding `"feed"` ($\\tilde s$, `(B, A)`), and for
                attention with memory `"attention"` (its state, a dict of
                `(B, S)` tensors such as the previous alignment).
        """
        batch = ops.shape(encoder_outputs)[0]
        if initial_state is None:
            initial_state = [
                ops.zeros((batch, size), dtype=self.cell.compute_dtype)
                for size in self._state_sizes()
            ]
        else:
            initial_state = keras.tree.flatten(initial_state)
        self._check_cell_states("initial_state", initial_state, encoder_outputs)
        state = {
            "cell": list(initial_state),
            "keys": self.attention.project_keys(encoder_outputs),
        }
        if self.flow == "luong" and self.input_feeding:
            state["feed"] = ops.zeros(
                (batch, self._feed_dim), dtype=self.compute_dtype
            )
        attention_state = self.attention.get_initial_attention_state(
            encoder_outputs, encoder_padding_mask
        )
        if attention_state:
            state["attention"] = attention_state
        return state

    def step(
        self,
        inputs_t,
        state,
        encoder_outputs,
        encoder_padding_mask=None,
        training=None,
    ):
        """One decoding step.

        Args:
            inputs_t (Tensor): Shape `(B, E)`, the embedded previous token.
            state (dict): The dict of `get_initial_state` or of the previous
                step.
            encoder_outputs (Tensor): Shape `(B, S, De)`.
            encoder_padding_mask (Tensor | None): Shape `(B, S)`, boolean.
            training (bool): Whether dropout is active.

        Returns:
            tuple[Tensor, dict, Tensor]: `(output_t, new_state,
                alignment_t)`: the output `(B, U)` or `(B, A)`, the new state
                dict, the weights `(B, S)`.
        """
        if len(inputs_t.shape) != 2:
            raise ValueError(
                f"{self._where()}: `inputs_t` must be (B, E), one step. "
                f"Received: inputs_t.shape={tuple(inputs_t.shape)}"
            )
        self._check_inputs("inputs_t", inputs_t, encoder_outputs)
        self._check_state(state, encoder_outputs)
        return self._step(
            inputs_t, state, encoder_outputs, encoder_padding_mask, training
        )

    def _check_cell_states(self, name, states, encoder_outputs):
        """`states`, a flat list, are the cell's: one `(B, size)` tensor
        per state size, with the batch of `encoder_outputs`."""
        sizes = self._state_sizes()
        if len(states) != len(sizes) or any(
            len(getattr(s, "shape", ())) != 2
            or s.shape[-1] not in (None, size)
            or not _same_dim(s.shape[0], encoder_outputs.shape[0])
            for s, size in zip(states, sizes, strict=False)
        ):
            raise ValueError(
                f"{self._where()}: `{name}` must be {len(sizes)} "
                f"tensor(s) (B, size) of sizes {sizes}, with the batch of "
                f"`encoder_outputs` {tuple(encoder_outputs.shape)}. Received: "
                f"{name} shapes "
                f"{[tuple(getattr(s, 'shape', ())) for s in states]}"
            )

    def _check_state(self, state, encoder_outputs):
        """A `state` given to `step` is one `get_initial_state` or `step`
        made for these `encoder_outputs`."""
        required = ["cell", "keys"]
        if self.flow == "luong" and self.input_feeding:
            required.append("feed")
        if not isinstance(state, dict) or not set(required) <= set(state):
            received = type(state).__name__
            if isinstance(state, dict):
                missing = [key for key in required if key not in state]
                received = f"a dict without {missing} (keys {sorted(state)})"
            raise ValueError(
                f"{self._where()}: `state` must be the dict of "
                f"`get_initial_state` or of the previous step, with keys "
                f"{required}. Received: {received}"
            )
        self._check_cell_states(
            "state['cell']", keras.tree.flatten(state["cell"]), encoder_outputs
        )
        keys = state["keys"]
        if len(keys.shape) != 3 or not all(
            _same_dim(a, b)
            for a, b in zip(
                keys.shape[:2], encoder_outputs.shape[:2], strict=True
            )
        ):
            raise ValueError(
                f"{self._where()}: `state['keys']` must be the keys "
                "`get_initial_state` projected from these `encoder_outputs` "
                f"{tuple(encoder_outputs.shape)}: (B, S, units). Received: "
                f"state['keys'].shape={tuple(keys.shape)}"
            )
        feed = state.get("feed")
        if "feed" in required and (
            len(feed.shape) != 2
            or not _same_dim(feed.shape[0], encoder_outputs.shape[0])
            or feed.shape[-1] not in (None, self._feed_dim)
        ):
            raise ValueError(
                f"{self._where()}: `state['feed']` must be the previous "
                f"attentional output (B, {self._feed_dim}). Received: "
                f"state['feed'].shape={tuple(feed.shape)}"
            )

    def _step(
        self,
        inputs_t,
        state,
        encoder_outputs,
        encoder_padding_mask,
        training,
        loop_noise=None,
    ):
        """`step`, with the attention's randomness (`draw_loop_noise`:
        dropout mask, score noise, `(B, S)` each) when the caller drew it
        (the teacher-forced loop)."""
        attention_state = state.get("attention")
        if self.attention.attention_state_names and attention_state is None:
            raise ValueError(
                f"{self._where()}: `state` must hold the attention's state "
                "under 'attention' (start from `get_initial_state`): "
                f"{type(self.attention).__name__} reads its previous "
                f"alignment. Received: state with keys {sorted(state)}"
            )
        noise = loop_noise or {}

        def attend(query):  # (context, alignment)
            return self.attention.attend(
                query,
                encoder_outputs,
                state["keys"],
                value_mask=encoder_padding_mask,
                return_attention_scores=True,
                training=training,
                attention_state=attention_state,
                **noise,
            )

        parts = [inputs_t]
        if self.flow == "bahdanau":
            context, alignment = attend(state["cell"][0])  # with s_{t-1}
            parts.append(context)
        elif self.input_feeding:
            parts.append(state["feed"])
        # Always a new tensor (a copy of a lone `inputs_t`): the cell's
        # `__call__` would warn that it drops a mask an Embedding attached
        # to `inputs_t` (JAX finds masks by the array's identity).
        parts = [ops.cast(part, inputs_t.dtype) for part in parts]
        cell_input = (
            ops.concatenate(parts, axis=-1)
            if len(parts) > 1
            else ops.copy(inputs_t)
        )
        cell_state = keras.tree.pack_sequence_as(
            _as_list(self.cell.state_size), keras.tree.flatten(state["cell"])
        )  # nested as the cell's (StackedRNNCells: a list per cell)
        output, new_cell = self.cell(cell_input, cell_state, training=training)
        new_state = {
            "cell": keras.tree.flatten(new_cell),
            "keys": state["keys"],
        }
        if self.flow == "luong":
            context, alignment = attend(output)  # with s_t
            output = call_leaf(
                self.attention_projection,
                ops.concatenate(
                    [ops.cast(context, output.dtype), output], axis=-1
                ),
            )  # (B, A)
            if self.input_feeding:
                new_state["feed"] = output
        if attention_state is not None:
            new_state["attention"] = self.attention.next_attention_state(
                attention_state, alignment
            )
        return output, new_state, alignment

    def _where(self):
        return f"AttentionDecoder (layer '{self.name}')"

    def _state_sizes(self):
        """The sizes of the cell's states, flat (one per state tensor)."""
        return [int(size) for size in keras.tree.flatten(self.cell.state_size)]

    def _cell_output_dim(self):
        """The size of the cell's output (the last cell's of a stack)."""
        size = getattr(self.cell, "output_size", None)
        return self._state_sizes()[0] if size is None else int(size)

    def _check_inputs(self, name, inputs, encoder_outputs):
        """After `build`: the inputs' and source's sizes it was built for,
        and one batch."""
        if len(encoder_outputs.shape) != 3:
            raise ValueError(
                f"{self._where()}: `encoder_outputs` must be (B, S, De). "
                "Received: "
                f"encoder_outputs.shape={tuple(encoder_outputs.shape)}"
            )
        built = (
            getattr(self, "_input_dim", None),
            getattr(self, "_context_dim", None),
        )
        given = (inputs.shape[-1], encoder_outputs.shape[-1])
        if not all(map(_same_dim, built, given)) or not _same_dim(
            inputs.shape[0], encoder_outputs.shape[0]
        ):
            raise ValueError(
                f"{self._where()}: `{name}` and `encoder_outputs` must share "
                f"the batch and have the sizes it was built with (E="
                f"{built[0]}, De={built[1]}). Received: {name}.shape="
                f"{tuple(inputs.shape)}, "
                f"encoder_outputs.shape={tuple(encoder_outputs.shape)}"
            )


def _same_dim(a, b):
    """Whether two dims may be equal (an unknown one may be anything)."""
    if a is None or b is None:
        return True
    a, b = checks.static_dim(a), checks.static_dim(b)
    return a is None or b is None or a == b


def _as_list(states):
    return list(states) if isinstance(states, (list, tuple)) else [states]


def _where_real(real, new, old):
    """`new` in the rows of real steps (`real` `(B,)`), else `old`."""
    real = real[(slice(None),) + (None,) * (len(new.shape) - 1)]
    return ops.where(real, new, old)
