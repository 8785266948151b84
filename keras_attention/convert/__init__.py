"""Weights in and out: Keras and keras-hub attention layers to ours and back.

`from_keras` builds the equivalent `keras_attention` layer from a built
Keras or keras-hub layer and copies its weights; `to_keras` does the
reverse; `replace_transformer_layers` swaps the Transformer layers of a
whole keras-hub backbone (GPT-2, BERT, ...) for our blocks. Weights are
matched by their paths (`query/kernel` becomes `query_dense/kernel`), never
by the order of `get_weights`, which differs between the libraries.

Keras / keras-hub layer and the `keras_attention` layer it becomes:

* `keras.layers.MultiHeadAttention` and keras-hub's
  `CachedMultiHeadAttention`: `MultiHeadSelfAttention`, or
  `CrossAttention` with `cross_attention=True`.
* `keras.layers.GroupQueryAttention`: the same, with
  `num_key_value_heads`.
* keras-hub's `TransformerEncoder`: `TransformerEncoderBlock`.
* keras-hub's `TransformerDecoder`: `TransformerDecoderBlock`, with or
  without cross-attention.

The projections have the same shapes in both libraries (`(D, N, H)` for
queries, `(N, V, D)` for the output), so a converted layer computes the
same function, to float32 rounding, with these differences:

* A query whose keys are all masked gets all-zero weights here (a zero
  context). Keras agrees when it computes the weights (with
  `return_attention_scores=True` or dropout in training), but its fused
  path (`keras.ops.dot_product_attention`) gives such a query uniform
  weights: the mean of the values.
* Keras's `sliding_window=w` is a symmetric band, `|i - j| < w`: it becomes
  our pair window `(w - 1, w - 1)`. Our int window `w` sees only the past,
  so it has no Keras equivalent and is refused by `to_keras`.
* `CrossAttention` has no `use_causal_mask`: pass the pattern as an
  `attention_mask`. A converted `CachedMultiHeadAttention` is called with
  our `cache` and `cache_index` (the same `(B, 2, S_max, N, H)` layout).

A converted layer keeps what is frozen: the layer's `trainable`, and
the weights of a frozen sublayer stay out of training.

What cannot be converted, and raises a `ValueError` naming the argument:

* A subclass of one of the layers above (a keras-hub model's own
  attention, say): it may compute something its weights do not show,
  so only the listed classes themselves are converted.

* `attention_axes` other than the sequence axis, an `output_shape` other
  than the query's dim, and `use_gate=True` (Keras): our layers attend
  over one sequence axis and project back to the query's dim, ungated.
* `use_rotary`, `alibi`, `logit_soft_cap`, `use_qk_norm`, an int or
  asymmetric `sliding_window` (ours): Keras and keras-hub have no such
  arguments. Grouped-query heads with `value_dim != key_dim` (Keras's
  `GroupQueryAttention` has one head dim), and Transformer blocks with
  grouped-query heads, a `key_dim` other than `D // num_heads`,
  `use_bias=False` or `use_rms_norm=True` (keras-hub's blocks fix all
  four).

Kernel and bias regularizers and constraints of a Keras layer do not
change its outputs; they are dropped with a warning. keras-hub's tanh
GELU (`gelu_approximate`, in GPT-2's and BERT's blocks) is a function
only keras-hub can load: a converted block holds the same function
registered by `keras_attention` instead, so it saves to `.keras` and
loads without keras-hub (`to_keras` gives keras-hub's back).

Examples:
    >>> import keras
    >>> import numpy as np
    >>> from keras_attention import convert
    >>> theirs = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    >>> x = np.random.rand(2, 5, 8).astype("float32")
    >>> want = theirs(x, x, use_causal_mask=True)
    >>> ours = convert.from_keras(theirs)
    >>> type(ours).__name__
    'MultiHeadSelfAttention'
    >>> got = ours(x, use_causal_mask=True)
    >>> diff = keras.ops.max(keras.ops.abs(got - want))
    >>> bool(keras.ops.convert_to_numpy(diff) < 1e-5)
    True
"""

from keras_attention.convert.converters import from_keras as from_keras
from keras_attention.convert.converters import (
    replace_transformer_layers as replace_transformer_layers,
)
from keras_attention.convert.converters import to_keras as to_keras

__all__ = ["from_keras", "replace_transformer_layers", "to_keras"]
