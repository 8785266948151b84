"""Attention math as pure functions on `keras.ops`.

Every layer of the library computes its masks, softmax and dot-product
attention with these functions, so the numerics live in exactly one
place: masks and the masked softmax, the angles of positions, the scores
and alignments of the RNN mechanisms, scaled dot-product attention and
`explain`, which says which path a call takes and why.

Shape legend: B batch, T query length, S key/value length, D model dim,
N query heads, K key/value heads, G = N // K query heads per key/value
head, H head dim (query/key), V value head dim.
"""

from keras_attention._core.masking import large_negative as large_negative
from keras_attention._core.masking import logits_dtype as logits_dtype
from keras_attention._core.masking import masked_softmax as masked_softmax
from keras_attention._core.masking import merge_masks as merge_masks
from keras_attention._core.reference import attend as attend
from keras_attention._core.reference import (
    attention_weights as attention_weights,
)
from keras_attention.functional.attention import (
    scaled_dot_product_attention as scaled_dot_product_attention,
)
from keras_attention.functional.explanation import explain as explain
from keras_attention.functional.masks import causal_mask as causal_mask
from keras_attention.functional.masks import (
    padding_to_attention_mask as padding_to_attention_mask,
)
from keras_attention.functional.masks import (
    segment_positions as segment_positions,
)
from keras_attention.functional.masks import structure_mask as structure_mask
from keras_attention.functional.positions import (
    position_angles as position_angles,
)
from keras_attention.functional.rnn import additive_score as additive_score
from keras_attention.functional.rnn import (
    monotonic_attention as monotonic_attention,
)

__all__ = [
    "additive_score",
    "attend",
    "attention_weights",
    "causal_mask",
    "explain",
    "large_negative",
    "logits_dtype",
    "masked_softmax",
    "merge_masks",
    "monotonic_attention",
    "padding_to_attention_mask",
    "position_angles",
    "scaled_dot_product_attention",
    "segment_positions",
    "structure_mask",
]
