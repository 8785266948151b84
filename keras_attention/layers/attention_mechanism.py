"""The shared base of the RNN attention layers (Bahdanau, Luong).

Shape legend: B batch, T query (decoder) steps, S source length,
Dq query dim, Dk key dim, Dv value dim, U units of a projection.
"""

import keras
from keras import ops

from keras_attention import _kernels
from keras_attention import functional
from keras_attention.layers import checks
from keras_attention.layers.sublayers import LoraMixin
from keras_attention.layers.sublayers import call_dense
from keras_attention.layers.sublayers import call_leaf
from keras_attention.layers.sublayers import dtype_config
from keras_attention.layers.sublayers import policy_for


@keras.saving.register_keras_serializable(package="keras_attention")
class AttentionMechanism(LoraMixin, keras.layers.Layer):
    """Base class of attention over encoder states for RNN decoders.

    A decoder state $s$ (the query) is scored against every encoder state
    $h_j$ (the keys), the scores are normalised with a masked softmax and
    the values are averaged with those weights (Bahdanau et al. 2015;
    Luong et al. 2015):

    $$e_j = \\operatorname{score}(s, h_j), \\quad
    \\alpha_j = \\frac{\\exp(e_j)}{\\sum_k \\exp(e_k)}, \\quad
    c = \\sum_j \\alpha_j h_j$$

    Subclasses differ only in how they score: they create their weights in
    `_build_score`, may move the query-independent part of the score into
    `project_keys` (computed once per source sequence, then reused at every
    decoding step through `attend`), and implement `_score`.

    Attention with memory (location-sensitive, monotonic) also reads the
    previous alignment: such a mechanism names its state tensors, each
    `(B, S)`, in `attention_state_names`, says how they start in
    `get_initial_attention_state` and how a step's weights update them in
    `next_attention_state`; `AttentionDecoder` carries them from step to
    step. A content-only mechanism has no state and pays nothing. A loop
    compiled over the steps in training draws their randomness (dropout
    masks, score noise) up front with `draw_loop_noise`.

    Args:
        dropout: Dropout rate on the attention weights during
            training. Defaults to `0.0`.
        kernel_initializer (str | keras.initializers.Initializer): Initializer
            of the projection kernels. Defaults to `"glorot_uniform"`.
        **kwargs (Any): Base `keras.layers.Layer` arguments (`name`, `dtype`,
            ...).

    Other Parameters: Call arguments:
        query (Tensor): Shape `(B, Dq)` (one decoder step) or `(B, T, Dq)`.
        value (Tensor): Shape `(B, S, Dv)`, the encoder states that are
            averaged.
        key (Tensor): Shape `(B, S, Dk)`, the encoder states that are scored.
            Defaults to `value`.
        value_mask (Tensor): Shape `(B, S)`, boolean, `True` for real source
            tokens. Defaults to the Keras mask of `value` (e.g. from
            `Embedding(mask_zero=True)`), if any.
        key_mask (Tensor): Shape `(B, S)`, boolean. Defaults to the Keras
            mask of `key`; a key is hidden where either mask is false.
        return_attention_scores (bool): Also return the weights.
        training (bool): Whether dropout is active.
        attention_state (dict | None): For a mechanism with memory, its
            state before the first query (see `get_initial_attention_state`).
            With `(B, T, Dq)` queries the T steps run in order, each reading
            the alignment of the one before. Defaults to the initial state.

    Returns:
        Tensor | tuple[Tensor, Tensor]: The context `(B, Dv)` or
            `(B, T, Dv)`; with `return_attention_scores=True`, the tuple
            `(context, weights)` with weights `(B, S)` or `(B, T, S)`. Source
            positions masked out get weight 0; a query with no visible source
            gets an all-zero context.
    """

    # Names of the `(B, S)` tensors a mechanism with memory carries from
    # one step to the next; empty for content-only attention.
    attention_state_names: tuple[str, ...] = ()

    def __init__(
        self,
        dropout: float = 0.0,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        checks.check_dropout(self._where(), dropout)
        self.dropout = dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True

    def build(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        self._check_shapes(query_shape, value_shape, key_shape)
        self._dropout_layer = keras.layers.Dropout(
            self.dropout,
            dtype=policy_for(self, "attention_dropout"),
            name="attention_dropout",
        )
        self._dropout_layer.build(None)
        self._build_score(query_shape[-1], key_shape[-1])
        self._built_dims = {"query": query_shape[-1], "key": key_shape[-1]}
        self.built = True

    def call(
        self,
        query,
        value,
        key=None,
        value_mask=None,
        return_attention_scores: bool = False,
        training=None,
        attention_state=None,
        key_mask=None,
    ):
        self._check_built_dims(query=query, value=value, key=key)
        key = value if key is None else key
        if key_mask is not None:
            value_mask = checks.padding_of_keys(
                self._where(), value_mask, key_mask, tuple(value.shape[:2])
            )
        keys = self.project_keys(key)
        if self.attention_state_names and len(query.shape) == 3:
            context, weights = self._attend_in_order(
                query, value, keys, value_mask, attention_state, training
            )
            if return_attention_scores:
                return context, weights
            return context
        return self.attend(
            query,
            value,
            keys,
            value_mask=value_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            attention_state=attention_state,
        )

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        return (*query_shape[:-1], value_shape[-1])

    def compute_output_spec(
        self,
        query,
        value,
        key=None,
        value_mask=None,
        return_attention_scores=False,
        training=None,
        attention_state=None,
        key_mask=None,
    ):
        key = value if key is None else key
        self._check_shapes(query.shape, value.shape, key.shape)
        checks.padding_of_keys(
            self._where(), value_mask, key_mask, tuple(value.shape[:2])
        )
        self._check_attention_state(attention_state, value.shape)
        output = keras.KerasTensor(
            self.compute_output_shape(query.shape, value.shape),
            dtype=self.compute_dtype,
        )
        if not return_attention_scores:
            return output
        scores = keras.KerasTensor(
            (*query.shape[:-1], value.shape[1]), dtype=self.compute_dtype
        )
        return output, scores

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "dropout": self.dropout,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
            }
        )
        return dtype_config(self, config)

    def project_keys(self, key):
        """The query-independent part of the score, once per source.

        A decoder loop calls this once per source sequence and passes the
        result to `attend` at every step, instead of calling the layer
        (which would project the keys again at each step).

        Args:
            key (Tensor): Shape `(B, S, Dk)`, the encoder states that are
                scored.

        Returns:
            Tensor: The projected keys `(B, S, U)` for `attend`.
        """
        return key

    def get_initial_attention_state(self, value, value_mask=None) -> dict:
        """The state of a mechanism with memory before the first step.

        Args:
            value (Tensor): Shape `(B, S, Dv)`, the encoder states.
            value_mask (Tensor | None): Shape `(B, S)`, boolean.

        Returns:
            dict: One `(B, S)` float tensor per name in
                `attention_state_names` (float32 under mixed precision);
                empty for content-only attention.
        """
        return {}

    def next_attention_state(self, attention_state, weights) -> dict:
        """The state after a step whose alignment is `weights`.

        Args:
            attention_state (dict): The state the step read.
            weights (Tensor): Shape `(B, S)`, the step's alignment (before
                dropout).

        Returns:
            dict: The state the next step reads.
        """
        return {}

    def attend(
        self,
        query,
        value,
        projected_keys,
        value_mask=None,
        return_attention_scores: bool = False,
        training=None,
        dropout_mask=None,
        attention_state=None,
        score_noise=None,
    ):
        """Attention with keys already passed through `project_keys`.

        Args:
            query (Tensor): Shape `(B, Dq)` or `(B, T, Dq)`.
            value (Tensor): Shape `(B, S, Dv)`.
            projected_keys (Tensor): The output of `project_keys(key)`.
            value_mask (Tensor | None): Shape `(B, S)`, boolean.
            return_attention_scores: Also return the weights.
            training (bool): Whether dropout is active.
            dropout_mask (Tensor): Shape `(B, S)` or `(B, T, S)`, float (the
                shape of the weights), or `None`. A dropout keep-mask already
                scaled by `1 / (1 - dropout)`: the weights are multiplied by it
                instead of going through the layer's own dropout, whatever
                `training` is. A loop compiled with `keras.ops.scan` draws its
                masks before the loop and passes one per step (as Keras's RNN
                layers do): a seed drawn inside the loop body would escape JAX's
                trace. Defaults to `None`: the layer's dropout, in training.
            attention_state (dict | None): For a mechanism with memory and a
                `(B, Dq)` query, the state of `get_initial_attention_state`
                or `next_attention_state`. Defaults to the initial state.
            score_noise (Tensor | None): Noise drawn before a compiled loop
                for a mechanism with noisy scores in training, the shape of
                the weights; `None` draws its own.

        Returns:
            Tensor | tuple[Tensor, Tensor]: As the layer's call.
        """
        self._check_built_dims(query=query, value=value)
        checks.check_mask(
            self._where(), "value_mask", value_mask, value.shape[:2]
        )
        single_step = len(query.shape) == 2
        weights_shape = (*query.shape[:-1], value.shape[1])
        checks.check_shape(
            self._where(), "dropout_mask", dropout_mask, weights_shape
        )
        if self.attention_state_names:
            if not single_step:
                raise ValueError(
                    f"{self._where()}: `attend` takes one `(B, Dq)` query "
                    "at a time for attention that reads its previous "
                    "alignment; call the layer for `(B, T, Dq)` queries. "
                    f"Received: query.shape={tuple(query.shape)}"
                )
            if attention_state is None:
                attention_state = self.get_initial_attention_state(
                    value, value_mask
                )
        self._check_attention_state(attention_state, value.shape)
        attention_state = self._as_state_dtype(attention_state)
        if single_step:
            query = ops.expand_dims(query, 1)  # (B, 1, Dq)
            if dropout_mask is not None:
                dropout_mask = ops.expand_dims(dropout_mask, 1)  # (B, 1, S)
            if score_noise is not None:
                score_noise = ops.expand_dims(score_noise, 1)  # (B, 1, S)
        scores = self._scores(
            query, projected_keys, attention_state, training, score_noise
        )  # (B, T, S)
        scores = ops.cast(scores, functional.logits_dtype(value.dtype))
        mask = None
        if value_mask is not None:
            mask = ops.expand_dims(ops.cast(value_mask, "bool"), 1)  # (B,1,S)
        weights = self._normalize(scores, mask, attention_state, training)
        weights = ops.cast(weights, value.dtype)  # (B, T, S)
        if dropout_mask is None:
            dropped = call_leaf(self._dropout_layer, weights, training=training)
        else:
            dropped = weights * ops.cast(dropout_mask, weights.dtype)
        context = functional.attend(dropped, value)  # (B, T, Dv)
        if single_step:
            context = ops.squeeze(context, 1)  # (B, Dv)
            weights = ops.squeeze(weights, 1)  # (B, S)
        if return_attention_scores:
            return context, weights
        return context

    def draw_loop_noise(self, shape) -> dict:
        """The randomness of the steps of a training loop, drawn before it.

        A loop compiled with `keras.ops.scan` cannot draw inside its body
        (the seed would escape JAX's trace), so it draws here once, as
        Keras's RNN layers draw their dropout masks, and passes step `t`'s
        slice `[t]` of each tensor to `attend` as the keyword argument of
        the same name. `AttentionDecoder` does so.

        Args:
            shape (tuple): `(T, B, S)`: steps, batch, source length.

        Returns:
            dict: `attend`'s `dropout_mask` (a keep-mask scaled by
                `1 / (1 - dropout)`, from the layer's dropout seed) when
                there is dropout, and for a mechanism with noisy scores
                its `score_noise`, each of `shape`; empty without
                randomness.
        """
        if not self.dropout:
            return {}
        ones = ops.ones(shape, dtype=self.compute_dtype)
        return {
            "dropout_mask": keras.random.dropout(
                ones, self.dropout, seed=self._dropout_layer.seed_generator
            )
        }

    def _attend_in_order(
        self, query, value, keys, value_mask, attention_state, training
    ):
        """`(B, T, Dq)` queries of a mechanism with memory, one step after
        the other in a compiled loop: `(B, T, Dv)` contexts and `(B, T, S)`
        weights."""
        if attention_state is None:
            attention_state = self.get_initial_attention_state(
                value, value_mask
            )
        self._check_attention_state(attention_state, value.shape)
        batch, length = ops.shape(query)[0], ops.shape(query)[1]
        source_length = ops.shape(value)[1]
        steps = {"query": ops.transpose(query, (1, 0, 2))}  # (T, B, Dq)
        if training:
            # Drawn before the loop: a seed drawn inside would escape JAX's
            # trace.
            steps.update(
                self.draw_loop_noise((length, batch, source_length))
            )  # (T, B, S) each
        init = {
            "state": self._as_state_dtype(attention_state),
            "context": ops.zeros(
                (batch, value.shape[-1]), dtype=self.compute_dtype
            ),
            "weights": ops.zeros((batch, source_length), self.compute_dtype),
        }

        def step(carry, inputs):
            context, weights = self.attend(
                inputs["query"],
                value,
                keys,
                value_mask=value_mask,
                return_attention_scores=True,
                training=training,
                dropout_mask=inputs.get("dropout_mask"),
                attention_state=carry["state"],
                score_noise=inputs.get("score_noise"),
            )
            carry = {
                "state": self.next_attention_state(carry["state"], weights),
                "context": context,
                "weights": weights,
            }
            # The carry is what is stacked; it keeps its dtypes.
            carry = keras.tree.map_structure(
                lambda new, old: ops.cast(new, old.dtype), carry, init
            )
            return carry

        stacked = _kernels.scan_carries(step, init, steps)
        context = ops.transpose(stacked["context"], (1, 0, 2))  # (B, T, Dv)
        weights = ops.transpose(stacked["weights"], (1, 0, 2))  # (B, T, S)
        return context, weights

    def _scores(self, query, projected_keys, attention_state, training, noise):
        """The scores `(B, T, S)` of a step; a mechanism with memory or
        noisy scores overrides this, content-only ones implement
        `_score`."""
        return self._score(query, projected_keys)

    def _normalize(self, scores, mask, attention_state, training):
        """Scores `(B, T, S)` to weights: the masked softmax."""
        return functional.masked_softmax(scores, mask)

    def _state_dtype(self):
        """Alignment states are summed over many steps: never in half
        precision."""
        return functional.logits_dtype(self.compute_dtype)

    def _as_state_dtype(self, attention_state):
        """A given state (autocast to half precision by `__call__` under
        mixed precision, or NumPy) in the state dtype."""
        if attention_state is None:
            return None
        dtype = self._state_dtype()
        return {k: ops.cast(v, dtype) for k, v in attention_state.items()}

    def _build_score(self, query_dim, key_dim):
        """Creates the scoring weights; subclasses override."""

    def _project_query(self, query):
        """`query_dense` of `(B, T, Dq)` queries (see `call_dense`)."""
        return call_dense(self.query_dense, query)

    def _score(self, query, projected_keys):
        """Scores `(B, T, Dq)` queries against projected keys: `(B, T, S)`."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement `_score`."
        )

    def _where(self):
        return f"{type(self).__name__} (layer '{self.name}')"

    def _check_shapes(self, query_shape, value_shape, key_shape):
        received = (
            f"Received: query.shape={tuple(query_shape)}, "
            f"value.shape={tuple(value_shape)}, key.shape={tuple(key_shape)}"
        )
        if len(query_shape) not in (2, 3):
            raise ValueError(
                f"{self._where()}: `query` must be (B, Dq) or (B, T, Dq). "
                + received
            )
        if len(value_shape) != 3 or len(key_shape) != 3:
            raise ValueError(
                f"{self._where()}: `value` and `key` must be (B, S, D). "
                + received
            )
        checks.check_batch_and_length(
            self._where(), query_shape, value_shape, key_shape
        )
        if query_shape[-1] is None or key_shape[-1] is None:
            raise ValueError(
                f"{self._where()}: the feature dims of `query` and `key` "
                "must be known. " + received
            )

    def _check_built_dims(self, **tensors):
        """Floating-point features; `query` and `key` of the built dims."""
        dims = getattr(self, "_built_dims", {})
        for name, x in tensors.items():
            if x is not None:
                checks.check_built_dim(self._where(), name, x, dims.get(name))

    def _check_attention_state(self, attention_state, value_shape):
        if attention_state is None:
            return
        names = self.attention_state_names
        if not isinstance(attention_state, dict) or set(attention_state) != set(
            names
        ):
            received = (
                sorted(attention_state)
                if isinstance(attention_state, dict)
                else type(attention_state).__name__
            )
            raise ValueError(
                f"{self._where()}: `attention_state` must be a dict with the "
                f"keys {list(names)}"
                + (" (this attention has no state)" if not names else "")
                + f". Received: attention_state with keys {received}"
            )
        for name in names:
            checks.check_shape(
                self._where(),
                f"attention_state['{name}']",
                attention_state[name],
                tuple(value_shape[:2]),
            )
