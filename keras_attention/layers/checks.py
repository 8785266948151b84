"""Input checks shared by the layers: clear `ValueError`s, written once."""


def positive_int(value) -> bool:
    """Whether `value` is an int (not a bool) greater than zero."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_shape(where: str, name: str, tensor, expected):
    """Static check that `tensor` has the rank and known dims of `expected`.

    `None` in either shape matches anything; `tensor=None` passes.
    """
    if tensor is None:
        return
    shape = tuple(tensor.shape)
    ok = len(shape) == len(expected) and all(
        a is None or b is None or a == b
        for a, b in zip(shape, expected, strict=True)
    )
    if not ok:
        raise ValueError(
            f"{where}: `{name}` must have shape {tuple(expected)}. "
            f"Received: {name}.shape={shape}"
        )


def check_batch_and_length(where: str, query_shape, value_shape, key_shape):
    """Queries, keys and values share the batch; keys and values the length."""
    pairs = [
        (query_shape[0], value_shape[0]),
        (key_shape[0], value_shape[0]),
        (key_shape[1], value_shape[1]),
    ]
    for a, b in pairs:
        if a is not None and b is not None and a != b:
            raise ValueError(
                f"{where}: the batch sizes of `query`, `key` and `value` and "
                "the lengths of `key` and `value` must match. Received: "
                f"query.shape={tuple(query_shape)}, "
                f"value.shape={tuple(value_shape)}, "
                f"key.shape={tuple(key_shape)}"
            )
