"""An RNN decoder with attention over the encoder states (Bahdanau et
al. 2015; Luong et al. 2015).

Shape legend: B batch, T target steps, S source length, E decoder input dim,
De encoder dim, U cell units, A attentional state dim.
"""

import keras
from keras import ops

from keras_attention import _kernels
from keras_attention.layers import checks
from keras_attention.layers import decoder_checks
from keras_attention.layers.decoder_step import AttentionStepMixin
from keras_attention.layers.sublayers import LoraMixin
from keras_attention.layers.sublayers import dtype_config
from keras_attention.layers.sublayers import policy_for


@keras.saving.register_keras_serializable(package="keras_attention")
class AttentionDecoder(AttentionStepMixin, LoraMixin, keras.layers.Layer):
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
    also compiles on JAX. Cell dropout is not supported; put `Dropout` on
    the decoder's inputs and outputs. For step-by-step inference use
    `get_initial_state` and `step`, which `keras_attention.decoding`
    drives.

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
        cell, attention, flow, activation = decoder_checks.decoder_arguments(
            self._where(),
            cell,
            attention,
            flow,
            attention_dim,
            input_feeding,
            attention_activation,
        )
        self.cell = cell
        self.attention = attention
        self.flow = flow
        self.attention_activation = activation
        self.attention_dim = attention_dim
        self.input_feeding = input_feeding
        self.supports_masking = True

    def build(self, inputs_shape, encoder_outputs_shape):
        decoder_checks.check_encoder_outputs_shape(
            self._where(), inputs_shape, encoder_outputs_shape, "(B, T, E)"
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
        where = self._where()
        checks.check_flag(
            where, "return_attention_scores", return_attention_scores
        )
        self._check_inputs("inputs", inputs, encoder_outputs)
        checks.check_mask(where, "inputs_mask", target_mask, inputs.shape[:2])
        checks.check_mask(
            where,
            "encoder_padding_mask",
            encoder_padding_mask,
            encoder_outputs.shape[:2],
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
                carry = _keep_padding(step_inputs["real"], carry, previous)
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
        shape = (*inputs.shape[:2], encoder_outputs.shape[1])  # (B, T, S)
        return outputs, keras.KerasTensor(shape, dtype=self.compute_dtype)

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

    def _where(self):
        return f"AttentionDecoder (layer '{self.name}')"


def _keep_padding(real, carry, previous):
    """As Keras's RNN layers: in the rows of a padding step (`real` `(B,)`
    false) the loop keeps the state and the previous output; the step's
    alignment row is zeros."""
    kept = {**previous, "alignment": ops.zeros_like(carry["alignment"])}

    def where_real(new, old):
        rows = real[(slice(None),) + (None,) * (len(new.shape) - 1)]
        return ops.where(rows, new, old)

    return keras.tree.map_structure(where_real, carry, kept)
