"""The step of an RNN decoder with attention: its state and one step of
Bahdanau's or Luong's flow (Bahdanau et al. 2015; Luong et al. 2015).

Shape legend: B batch, S source length, E decoder input dim, De encoder
dim, U cell units, A attentional state dim.
"""

import keras
from keras import ops

from keras_attention.layers import checks
from keras_attention.layers import decoder_checks
from keras_attention.layers.sublayers import call_leaf


class AttentionStepMixin:
    """`get_initial_state` and `step` of `AttentionDecoder`, which runs
    the same step over the target in its teacher-forced loop. The layer
    provides `cell`, `attention`, `flow`, `input_feeding`, and after
    `build` `attention_projection` (Luong flow) and the sizes it was built
    for."""

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
        self._check_built("get_initial_state")
        batch = ops.shape(encoder_outputs)[0]
        if initial_state is None:
            initial_state = [
                ops.zeros((batch, size), dtype=self.cell.compute_dtype)
                for size in self._state_sizes()
            ]
        else:
            initial_state = keras.tree.flatten(initial_state)
        decoder_checks.check_cell_states(
            self._where(),
            "initial_state",
            initial_state,
            self._state_sizes(),
            encoder_outputs,
        )
        state = {
            "cell": list(initial_state),
            "keys": self.attention.project_keys(encoder_outputs),
        }
        if self._feeds():
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
        self._check_built("step")
        self._check_inputs("inputs_t", inputs_t, encoder_outputs)
        checks.check_mask(
            self._where(),
            "encoder_padding_mask",
            encoder_padding_mask,
            encoder_outputs.shape[:2],
        )
        decoder_checks.check_step_state(
            self._where(),
            state,
            encoder_outputs,
            self._state_sizes(),
            self._feed_dim if self._feeds() else None,
            self.attention,
        )
        return self._step(
            inputs_t, state, encoder_outputs, encoder_padding_mask, training
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
        sizes = self.cell.state_size
        cell_state = keras.tree.pack_sequence_as(
            list(sizes) if isinstance(sizes, (list, tuple)) else [sizes],
            keras.tree.flatten(state["cell"]),
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

    def _check_built(self, method):
        """`method` needs the sublayers `build` makes."""
        if not self.built:
            raise ValueError(
                f"{self._where()}: call or build the decoder before "
                f"`{method}`, so that its cell and attention are built. "
                "Received: an unbuilt decoder"
            )

    def _feeds(self):
        """Whether the previous attentional state is fed with the input."""
        return self.flow == "luong" and self.input_feeding

    def _check_inputs(self, name, inputs, encoder_outputs):
        built = (
            getattr(self, "_input_dim", None),
            getattr(self, "_context_dim", None),
        )
        decoder_checks.check_decoder_inputs(
            self._where(), name, inputs, encoder_outputs, built
        )

    def _state_sizes(self):
        """The sizes of the cell's states, flat (one per state tensor)."""
        return [int(size) for size in keras.tree.flatten(self.cell.state_size)]

    def _cell_output_dim(self):
        """The size of the cell's output (the last cell's of a stack)."""
        size = getattr(self.cell, "output_size", None)
        return self._state_sizes()[0] if size is None else int(size)
