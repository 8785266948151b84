"""The shared base of the RNN attention layers (Bahdanau, Luong).

Shape legend: B batch, T query (decoder) steps, S source length,
Dq query dim, Dk key dim, Dv value dim, U units of a projection.
"""

import keras
from keras import ops

from keras_attention import functional
from keras_attention.layers import checks
from keras_attention.layers.sublayers import invoke


@keras.saving.register_keras_serializable(package="keras_attention")
class AttentionMechanism(keras.layers.Layer):
    """Base class of attention over encoder states for RNN decoders.

    A decoder state `s` (the query) is scored against every encoder state
    `h_j` (the keys), the scores are normalised with a masked softmax and
    the values are averaged with those weights (Bahdanau et al. 2015;
    Luong et al. 2015):

    $$e_j = \\operatorname{score}(s, h_j), \\quad
    \\alpha_j = \\frac{\\exp(e_j)}{\\sum_k \\exp(e_k)}, \\quad
    c = \\sum_j \\alpha_j h_j$$

    Subclasses differ only in how they score: they create their weights in
    `_build_score`, may move the query-independent part of the score into
    `project_keys` (computed once per source sequence, then reused at every
    decoding step through `attend`), and implement `_score`.

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
        return_attention_scores (bool): Also return the weights.
        training (bool): Whether dropout is active.

    Returns:
        Tensor | tuple[Tensor, Tensor]: The context `(B, Dv)` or
            `(B, T, Dv)`; with `return_attention_scores=True`, the tuple
            `(context, weights)` with weights `(B, S)` or `(B, T, S)`. Source
            positions masked out get weight 0; a query with no visible source
            gets an all-zero context.
    """

    def __init__(
        self,
        dropout: float = 0.0,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(
                f"{self._where()}: `dropout` must be in [0, 1). "
                f"Received: dropout={dropout}"
            )
        self.dropout = dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True
        self._dropout_layer = keras.layers.Dropout(
            dropout, dtype=self.dtype_policy, name="attention_dropout"
        )

    def build(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        self._check_shapes(query_shape, value_shape, key_shape)
        self._build_score(query_shape[-1], key_shape[-1])
        self._dropout_layer.build(None)
        self.built = True

    def call(
        self,
        query,
        value,
        key=None,
        value_mask=None,
        return_attention_scores: bool = False,
        training=None,
    ):
        key = value if key is None else key
        return self.attend(
            query,
            value,
            self.project_keys(key),
            value_mask=value_mask,
            return_attention_scores=return_attention_scores,
            training=training,
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
    ):
        key = value if key is None else key
        self._check_shapes(query.shape, value.shape, key.shape)
        self._check_mask(value_mask, value.shape)
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
        return config

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

    def attend(
        self,
        query,
        value,
        projected_keys,
        value_mask=None,
        return_attention_scores: bool = False,
        training=None,
        dropout_mask=None,
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

        Returns:
            Tensor | tuple[Tensor, Tensor]: As the layer's call.
        """
        self._check_mask(value_mask, value.shape)
        single_step = len(query.shape) == 2
        checks.check_shape(
            self._where(),
            "dropout_mask",
            dropout_mask,
            (*query.shape[:-1], value.shape[1]),
        )
        if single_step:
            query = ops.expand_dims(query, 1)  # (B, 1, Dq)
            if dropout_mask is not None:
                dropout_mask = ops.expand_dims(dropout_mask, 1)  # (B, 1, S)
        scores = self._score(query, projected_keys)  # (B, T, S)
        scores = ops.cast(scores, functional.logits_dtype(value.dtype))
        mask = None
        if value_mask is not None:
            mask = ops.expand_dims(ops.cast(value_mask, "bool"), 1)  # (B,1,S)
        weights = ops.cast(functional.masked_softmax(scores, mask), value.dtype)
        if dropout_mask is None:
            dropped = invoke(self._dropout_layer, weights, training=training)
        else:
            dropped = weights * ops.cast(dropout_mask, weights.dtype)
        context = functional.attend(dropped, value)  # (B, T, Dv)
        if single_step:
            context = ops.squeeze(context, 1)  # (B, Dv)
            weights = ops.squeeze(weights, 1)  # (B, S)
        if return_attention_scores:
            return context, weights
        return context

    def _draw_dropout_mask(self, shape):
        """A keep-mask of `shape` scaled by `1 / (1 - dropout)`, drawn from
        the seed generator of the layer's dropout; `None` without dropout.
        """
        if not self.dropout:
            return None
        ones = ops.ones(shape, dtype=self.compute_dtype)
        return keras.random.dropout(
            ones, self.dropout, seed=self._dropout_layer.seed_generator
        )

    def _build_score(self, query_dim, key_dim):
        """Creates the scoring weights; subclasses override."""

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

    def _check_mask(self, value_mask, value_shape):
        checks.check_mask(
            self._where(), "value_mask", value_mask, tuple(value_shape[:2])
        )
