"""Attention patterns as functions: mask mods, score mods and block masks.

A mask mod says which keys a query may see; a score mod rewrites the
logits. Pass them to `functional.scaled_dot_product_attention`
(`mask_mod=`, `score_mod=`); every path runs them, and the blockwise path
skips the blocks a mask mod leaves empty.

$$\\operatorname{mask\\_mod}(b, h, q, k) \\in \\{\\text{True}, \\text{False}\\}
\\qquad
\\operatorname{score\\_mod}(s, b, h, q, k) = s'$$

Both are called with int32 index tensors that broadcast to `(B, N, T, S)`
(`batch` `(B, 1, 1, 1)`, `head` `(1, N, 1, 1)`, `q_idx` `(1, 1, T, 1)`,
`kv_idx` `(1, 1, 1, S)`) or with any block of that grid, so a mod must be
elementwise in `keras.ops`. The mods here cover the patterns of the
literature; write a new one as a function of the same four tensors:

```python
def prefix_or_causal(batch, head, q_idx, kv_idx):
    return (kv_idx < 16) | (kv_idx <= q_idx)
```

Shape legend: B batch, N heads, T query length, S key length.
"""

from keras_attention.mods.block_mask import BlockMask as BlockMask
from keras_attention.mods.block_mask import block_mask as block_mask
from keras_attention.mods.masks import and_masks as and_masks
from keras_attention.mods.masks import causal as causal
from keras_attention.mods.masks import chunked as chunked
from keras_attention.mods.masks import document as document
from keras_attention.mods.masks import or_masks as or_masks
from keras_attention.mods.masks import prefix_lm as prefix_lm
from keras_attention.mods.masks import sink_tokens as sink_tokens
from keras_attention.mods.masks import sliding_window as sliding_window
from keras_attention.mods.scores import alibi as alibi
from keras_attention.mods.scores import (
    relative_position_bias as relative_position_bias,
)
from keras_attention.mods.scores import (
    relative_position_bucket as relative_position_bucket,
)
from keras_attention.mods.scores import soft_cap as soft_cap

__all__ = [
    "BlockMask",
    "alibi",
    "and_masks",
    "block_mask",
    "causal",
    "chunked",
    "document",
    "or_masks",
    "prefix_lm",
    "relative_position_bias",
    "relative_position_bucket",
    "sink_tokens",
    "sliding_window",
    "soft_cap",
]
