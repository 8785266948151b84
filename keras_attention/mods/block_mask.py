"""Block masks: a mask mod evaluated once into a map of blocks."""

from keras_attention import _kernels
from keras_attention._core.checks import positive_integer
from keras_attention._core.mods import BlockTable
from keras_attention._core.mods import check_mod_sizes
from keras_attention.mods._common import callables
from keras_attention.mods._common import tensors


class BlockMask(BlockTable):
    """A mask mod evaluated once into a map of blocks, to be reused.

    The blockwise path classifies each pair of a query block and a key
    block as empty (skipped, forward and backward), full (no elementwise
    mask) or partial (the mod applied inside it). Given a `BlockMask` as
    `mask_mod`, it reads that map instead of evaluating the mod over the
    whole grid again, so that several layers and training steps pay for
    it once. It is called like the mod itself, so every path takes it.

    Attributes:
        mask_mod: The mask mod.
        batch_size (int): The grid it was evaluated on, as
            `num_heads`, `query_length` and `key_length` (each an int).
        num_heads (int): See `batch_size`.
        query_length (int): See `batch_size`.
        key_length (int): See `batch_size`.
        block_size (int): Query and key rows per block.
        blocks (Tensor): int32 `(ceil(T / block_size),
            ceil(S / block_size))`: 0 empty, 1 partial, 2 full.
    """

    def __init__(
        self,
        mask_mod,
        batch_size,
        num_heads,
        query_length,
        key_length,
        block_size,
    ):
        self.mask_mod = mask_mod
        self.batch_size, self.num_heads = batch_size, num_heads
        self.query_length, self.key_length = query_length, key_length
        self.block_size = block_size
        self.blocks = _kernels.mod_blocks(
            mask_mod,
            batch_size,
            num_heads,
            query_length,
            key_length,
            block_size,
        )

    def __call__(self, batch, head, q_idx, kv_idx):
        batch, head, q_idx, kv_idx = tensors(batch, head, q_idx, kv_idx)
        return self.mask_mod(batch, head, q_idx, kv_idx)

    def __repr__(self):
        return (
            f"block_mask({self.mask_mod!r}, batch_size={self.batch_size}, "
            f"num_heads={self.num_heads}, query_length={self.query_length}, "
            f"key_length={self.key_length}, block_size={self.block_size})"
        )


def block_mask(
    mask_mod,
    batch_size: int,
    num_heads: int,
    query_length: int,
    key_length: int,
    block_size: int | None = None,
) -> BlockMask:
    """Evaluates a mask mod once into a reusable `BlockMask`.

    Args:
        mask_mod: The mask mod.
        batch_size: The batch size of the calls it serves.
        num_heads: Their number of query heads.
        query_length: Their number of queries.
        key_length: Their number of keys.
        block_size: Query and key rows per block: the blockwise path
            runs blocks of this size for the calls given this mask.
            Defaults to 256. Larger blocks do more work per step of the
            loops, and skip only where a whole larger block is empty:
            blocks of 512 can pay off for patterns whose documents or
            chunks span 512 positions or more; whether they do depends
            on the backend and the processor.

    A call of other sizes (or on blocks of another size) evaluates the
    mod itself instead of reading the map: the map of fewer batch rows or
    heads could miss what the mod does in the others.

    Returns:
        BlockMask: Usable wherever a mask mod is.

    Raises:
        ValueError: if `mask_mod` is not callable or a size is not a
            positive int.

    Examples:
        Causal attention over 1,024 positions in blocks of 256: the
        diagonal blocks are partial, those below it full, the rest empty.

        >>> import keras
        >>> import numpy as np
        >>> from keras_attention import mods
        >>> mask = block_mask(mods.causal(), 1, 8, 1024, 1024, block_size=256)
        >>> print(keras.ops.convert_to_numpy(mask.blocks))
        [[1 0 0 0]
         [2 1 0 0]
         [2 2 1 0]
         [2 2 2 1]]
    """
    where = "block_mask"
    callables(where, (mask_mod,))
    sizes = [
        positive_integer(where, name, value)
        for name, value in (
            ("batch_size", batch_size),
            ("num_heads", num_heads),
            ("query_length", query_length),
            ("key_length", key_length),
            (
                "block_size",
                _kernels.CHUNK_SIZE if block_size is None else block_size,
            ),
        )
    ]
    batch, _, query_length, key_length, _ = sizes
    check_mod_sizes(where, mask_mod, batch, query_length, key_length)
    return BlockMask(mask_mod, *sizes)
