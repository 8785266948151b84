"""Programmable structure: how every path calls a mask mod or a score mod.

A mask mod `mask_mod(batch, head, q_idx, kv_idx) -> bool` says which
keys a query may see (`True` = attend); a score mod
`score_mod(score, batch, head, q_idx, kv_idx) -> score` rewrites the
scaled logits. Both are called with int32 index tensors that broadcast to
`(B, N, R, C)`: the whole `(B, N, T, S)` grid on the reference path, one
block of `R` query rows and `C` keys on the blockwise path (absolute
indices, so a mod cannot tell the difference).

The blockwise path differentiates through its own backward pass, which
only sees its explicit inputs. `bind` therefore finds the tensors and
Keras variables a mod holds (through its closure, default arguments, the
globals it names, `functools.partial` arguments and the attributes of an
object or a Keras layer) and returns the mod as a function of them: its
floating tensors are differentiated like the query, key and value.

Shape legend: B batch, N heads, T query length, S key length, R query
rows and C keys of a block.
"""

import copy
import functools
import inspect
import types

import keras
import numpy as np
from keras import ops

from keras_attention._core.checks import is_tensor
from keras_attention._core.checks import static_dim

# What each kind of mod is called with.
SIGNATURES = {
    "mask_mod": "mask_mod(batch, head, q_idx, kv_idx)",
    "score_mod": "score_mod(score, batch, head, q_idx, kv_idx)",
}


def check_mod(where, name, mod):
    """`mod` if it is callable (or `None`) and can take the arguments a
    `name` is called with, else a `ValueError` (so that a score mod
    given as a mask mod, or the reverse, is named as such)."""
    if mod is not None and not callable(mod):
        raise ValueError(
            f"{where}: `{name}` must be a callable, "
            f"`{name.replace('_mod', '')}(... q_idx, kv_idx)`, or None. "
            f"Received: {name}={mod!r}"
        )
    if mod is not None and not _takes(mod, SIGNATURES[name].count(",") + 1):
        raise ValueError(
            f"{where}: `{name}` is called as `{SIGNATURES[name]}`; this "
            f"callable cannot take those arguments. Received: {name}={mod!r}"
        )
    return mod


def _takes(fn, count):
    """Whether `fn` can be called with `count` positional arguments (true
    where its signature cannot be read)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    kinds = inspect.Parameter
    if any(p.kind is kinds.VAR_POSITIONAL for p in parameters):
        most = count
    else:
        most = sum(
            p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
            for p in parameters
        )
    least = sum(
        p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
        and p.default is p.empty
        for p in parameters
    )
    keyword_only = any(
        p.kind is kinds.KEYWORD_ONLY and p.default is p.empty
        for p in parameters
    )
    return least <= count <= most and not keyword_only


def check_mod_sizes(where, mask_mod, batch, query_length, key_length):
    """Mask mods that hold data per batch row and position (document ids,
    prefix lengths) must hold it for a call of `batch` rows, `T =
    query_length` queries and `S = key_length` keys (ints, or `None` or
    tensors where unknown): else they would read another row's data, or
    past the end, which some backends clamp silently. Such a mod says so
    in a `check_sizes(where, batch, query_length, key_length)` method.
    At sequence positions (a cached step) its positions run past the
    call's lengths, so only the batch is checked there."""
    sizes = [
        d if isinstance(d, int) else None
        for d in (batch, query_length, key_length)
    ]

    def visit(mod, positioned):
        if isinstance(mod, Positioned):
            visit(mod.mod, True)
        elif isinstance(mod, Combined):
            for part in mod.mods:
                visit(part, positioned)
        elif isinstance(mod, BlockTable):
            visit(mod.mask_mod, positioned)
        elif hasattr(mod, "check_sizes"):
            lengths = [None, None] if positioned else sizes[1:]
            mod.check_sizes(where, sizes[0], *lengths)

    visit(mask_mod, False)


def serialize_mod(mod):
    """`mod`'s config for a layer's `get_config`, or `None`.

    A mod that is a Keras layer (one that owns weights, such as
    `RelativePositionBias`) may be shared by several attention layers, as
    T5's layers share one bias table. Keras marks an object it serializes
    twice in one file as shared, but only in the copies it keeps of the
    second and later configs: the first, which a layer's `get_config`
    returns before Keras copies it, would lose the mark, and the loaded
    model would hold two tables where there was one (and fail to load the
    second). While Keras writes a file, the layer's config therefore
    always carries its identity; when the file is loaded, every config
    with that identity is the same layer again. Outside (`get_config`
    called directly) the config is plain, so that it round-trips.
    """
    if mod is None:
        return None
    config = keras.saving.serialize_keras_object(mod)
    if isinstance(mod, keras.layers.Layer) and _sharing_objects():
        config["shared_object_id"] = id(mod)
    return config


def _sharing_objects():
    """Whether Keras is serializing inside its object-sharing scope (as it
    does to save or clone a model)."""
    from keras.src.backend.common import global_state

    return (
        global_state.get_global_attribute("shared_objects/id_to_config_map")
        is not None
    )


def grid(batch, heads, rows, cols):
    """The index tensors `(batch (B, 1, 1, 1), head (1, N, 1, 1), q_idx
    (1, 1, R, 1), kv_idx (1, 1, 1, C))`, int32, for `rows` `(R,)` and
    `cols` `(C,)` (absolute query and key indices)."""
    batch = ops.reshape(ops.arange(0, batch, dtype="int32"), (-1, 1, 1, 1))
    head = ops.reshape(ops.arange(0, heads, dtype="int32"), (1, -1, 1, 1))
    q_idx = ops.reshape(ops.cast(rows, "int32"), (1, 1, -1, 1))
    kv_idx = ops.reshape(ops.cast(cols, "int32"), (1, 1, 1, -1))
    return batch, head, q_idx, kv_idx


def visible(where, mask_mod, indices):
    """`mask_mod(*indices)`, checked: a boolean tensor that broadcasts to
    the grid of `indices` (see `grid`)."""
    result = _call(where, "mask_mod", mask_mod, indices, indices)
    if isinstance(result, bool):
        result = ops.convert_to_tensor(result)
    expected = _grid_shape(indices)
    dtype = _dtype(result)
    if dtype != "bool" or not _broadcasts(_shape(result), expected):
        raise ValueError(
            f"{where}: `mask_mod` must return booleans that broadcast to "
            f"(B, N, T, S) (here {expected}). Received: a result of shape "
            f"{_shape(result)} and dtype {dtype}"
        )
    while len(result.shape) < 4:  # the grid's rank: (B|1, N|1, T|1, S|1)
        result = ops.expand_dims(result, 0)
    return result


def modified(where, score_mod, scores, indices):
    """`score_mod(scores, *indices)`, checked: new logits of the scores'
    shape, in their dtype."""
    result = _call(where, "score_mod", score_mod, (scores, *indices), indices)
    shape, dtype = _shape(result), _dtype(result)
    if "float" not in dtype or not _same(shape, _shape(scores)):
        raise ValueError(
            f"{where}: `score_mod` must return float logits of the scores' "
            f"shape {_shape(scores)}. Received: a result of shape {shape} "
            f"and dtype {dtype}"
        )
    return ops.cast(result, scores.dtype)


def _call(where, name, mod, args, indices):
    """`mod(*args)`. An error the mod raises that is not one of this
    library's (a backend's broadcasting error, say: a mod computed from a
    tensor of the whole grid fails on a block of it) becomes a
    `ValueError` that says what the mod was given."""
    try:
        return mod(*args)
    except ValueError as error:
        if "Received:" in str(error):
            raise  # the library's own, naming its argument
        failure = error
    except Exception as error:  # a backend's own error type
        failure = error
    raise ValueError(
        f"{where}: `{name}` failed on index tensors that broadcast to "
        f"{_grid_shape(indices)}. A mod must compute elementwise from "
        "its index tensors: a path may call it on one block of the "
        "(B, N, T, S) grid at a time. Received: "
        f"{type(failure).__name__}: {failure}"
    ) from failure


class BlockTable:
    """A mask mod with its block map computed once (`mods.BlockMask`).

    Attributes:
        blocks: int32 tensor `(T'/C, S'/C)`: 0 empty, 1 partial, 2 full.
        block_size, query_length, key_length, batch_size, num_heads: int.
    """

    def fits(self, batch, heads, query_length, key_length, block_size):
        """Whether the map is the one a call of these sizes needs: made on
        the same grid (a map of fewer batch rows or heads could miss what
        a mod does in the others) in blocks of the same size."""
        return (batch, heads, query_length, key_length, block_size) == (
            self.batch_size,
            self.num_heads,
            self.query_length,
            self.key_length,
            self.block_size,
        )


class Bound:
    """A mod as a function of the tensors it holds.

    Attributes:
        held: list. The tensors the mod holds, its Keras variables' values
            first, in a fixed order.
        floating: list of bool. Which of them are floating (the ones it is
            differentiated by).
    """

    def __init__(self, mod):
        self.mod = mod
        self.variables, self._tensors = _reachable(mod)
        # A read of each variable (on TensorFlow, converting a variable
        # gives the variable itself, which a custom gradient refuses).
        values = [ops.copy(v) for v in self.variables]
        self.held = values + self._tensors
        self.floating = ["float" in _dtype(x) for x in self.held]

    def split(self, held):
        """`(floating, others)`: `held` in two lists."""
        pairs = list(zip(held, self.floating, strict=True))
        return [x for x, f in pairs if f], [x for x, f in pairs if not f]

    def join(self, floating, others):
        """The inverse of `split`."""
        floating, others = list(floating), list(others)
        return [floating.pop(0) if f else others.pop(0) for f in self.floating]

    def __call__(self, held, *args):
        """The mod on `args`, with the tensors `held` (as `self.held`) in
        place of its own."""
        count = len(self.variables)
        mapping = list(zip(self.variables, held[:count], strict=True))
        replaced = {
            id(old): new
            for old, new in zip(self._tensors, held[count:], strict=True)
            if new is not old
        }
        mod = _substitute(self.mod, replaced, {}) if replaced else self.mod
        with _Reads(mapping) as reads:
            result = mod(*args)
        if reads.missed:
            names = ", ".join(sorted({v.path for v in reads.missed}))
            raise ValueError(
                f"A mod reads the trainable Keras variables {names}, which "
                "it holds where they cannot be found (for instance through "
                "a class or a module attribute): on the blockwise path they "
                "would get no gradient. Close over them, pass them as default "
                "arguments or attributes, or use a Keras layer as the mod. "
                f"Received: {self.mod!r}"
            )
        return result


class _Reads(keras.StatelessScope):
    """A stateless scope with the values of the variables a mod holds,
    which notes the trainable variables read that it has no value for."""

    def __init__(self, mapping):
        super().__init__(state_mapping=mapping)
        self.missed = []

    def get_current_value(self, variable):
        value = super().get_current_value(variable)
        if value is None and variable.trainable:
            self.missed.append(variable)
        return value


def with_tensors(mod):
    """`mod` holding each NumPy array it holds as a backend tensor (a
    compiler that traces the mod, as PyTorch's does for FlexAttention,
    reads no NumPy arrays); `mod` itself where it holds none."""
    arrays = [] if mod is None else _reachable(mod, arrays=True)[1]
    if not arrays:
        return mod
    replaced = {id(x): ops.convert_to_tensor(x) for x in arrays}
    return _substitute(mod, replaced, {})


def _reachable(mod, arrays=False):
    """`(variables, tensors)`: the Keras variables and the tensors `mod`
    holds (with `arrays`, its NumPy arrays instead of its tensors), each
    once, in the order they are found."""
    variables, tensors, seen = {}, {}, set()

    def visit(obj, depth=0):
        if id(obj) in seen or depth > 16 or obj is None:
            return
        seen.add(id(obj))
        if isinstance(obj, keras.Variable):
            variables[id(obj)] = obj
        elif isinstance(obj, np.ndarray) if arrays else is_tensor(obj):
            tensors[id(obj)] = obj
        elif isinstance(obj, keras.Layer):
            for variable in obj.variables:
                visit(variable, depth + 1)
        else:
            for child in _children(obj):
                visit(child, depth + 1)

    visit(mod)
    return list(variables.values()), list(tensors.values())


def _children(obj):
    """What a mod can hold tensors in: containers, a function's closure,
    defaults and the globals it names, a partial's arguments, a bound
    method's object, an object's attributes."""
    if isinstance(obj, (list, tuple, set, frozenset)):
        return list(obj)
    if isinstance(obj, dict):
        return list(obj.values())
    if isinstance(obj, functools.partial):
        return [obj.func, *obj.args, *obj.keywords.values()]
    if isinstance(obj, types.MethodType):
        return [obj.__func__, obj.__self__]
    if isinstance(obj, types.FunctionType):
        cells = [cell.cell_contents for cell in obj.__closure__ or ()]
        named = [
            obj.__globals__[name]
            for name in obj.__code__.co_names
            if name in obj.__globals__ and _may_hold(obj.__globals__[name])
        ]
        defaults = list(obj.__defaults__ or ())
        return (
            cells
            + defaults
            + list((obj.__kwdefaults__ or {}).values())
            + (named)
        )
    if isinstance(obj, (type, types.ModuleType, str, bytes, int, float)):
        return []
    return list(getattr(obj, "__dict__", {}).values())


def _may_hold(value):
    """Whether a global a function names may hold what a mod reads: a
    tensor or variable, a container, or another function (a helper)."""
    return is_tensor(value) or isinstance(
        value,
        (
            keras.Variable,
            list,
            tuple,
            dict,
            types.FunctionType,
            functools.partial,
        ),
    )


def _substitute(obj, replaced, memo):
    """A copy of `obj` holding `replaced[id(t)]` wherever it held tensor
    `t` (objects that hold none of them are returned as they are)."""
    if id(obj) in memo:
        return memo[id(obj)]
    memo[id(obj)] = obj  # cycles end here
    if id(obj) in replaced:
        result = replaced[id(obj)]
    elif isinstance(obj, (list, tuple)):
        items = [_substitute(x, replaced, memo) for x in obj]
        changed = any(a is not b for a, b in zip(items, obj, strict=True))
        result = type(obj)(items) if changed else obj
    elif isinstance(obj, dict):
        result = {k: _substitute(v, replaced, memo) for k, v in obj.items()}
        if all(result[k] is v for k, v in obj.items()):
            result = obj
    elif isinstance(obj, functools.partial):
        result = functools.partial(
            _substitute(obj.func, replaced, memo),
            *_substitute(list(obj.args), replaced, memo),
            **_substitute(dict(obj.keywords), replaced, memo),
        )
    elif isinstance(obj, types.MethodType):
        result = types.MethodType(
            _substitute(obj.__func__, replaced, memo),
            _substitute(obj.__self__, replaced, memo),
        )
    elif isinstance(obj, types.FunctionType):
        result = _substitute_function(obj, replaced, memo)
    elif isinstance(obj, keras.Layer) or not hasattr(obj, "__dict__"):
        result = obj  # a layer's variables are mapped, not replaced
    elif isinstance(obj, (type, types.ModuleType)):
        result = obj
    else:
        attributes = {
            k: _substitute(v, replaced, memo) for k, v in vars(obj).items()
        }
        result = obj
        if any(attributes[k] is not v for k, v in vars(obj).items()):
            result = copy.copy(obj)
            vars(result).update(attributes)
    memo[id(obj)] = result
    return result


def _substitute_function(fn, replaced, memo):
    cells = tuple(
        types.CellType(_substitute(cell.cell_contents, replaced, memo))
        for cell in fn.__closure__ or ()
    )
    named = {}
    for name in fn.__code__.co_names:
        value = fn.__globals__.get(name)
        if name in fn.__globals__ and _may_hold(value):
            new = _substitute(value, replaced, memo)
            if new is not value:
                named[name] = new
    scope = {**fn.__globals__, **named} if named else fn.__globals__
    result = types.FunctionType(
        fn.__code__,
        scope,
        fn.__name__,
        _substitute(fn.__defaults__, replaced, memo),
        cells or None,
    )
    result.__kwdefaults__ = _substitute(fn.__kwdefaults__, replaced, memo)
    return result


def _grid_shape(indices):
    shapes = [_shape(x) for x in indices]
    return tuple(
        None if None in dims else max(dims)
        for dims in zip(*shapes, strict=True)
    )


def _shape(x):
    return tuple(static_dim(d) for d in getattr(x, "shape", ()))


def _dtype(x):
    if not hasattr(x, "dtype"):
        return type(x).__name__  # not a tensor: `None`, a number
    return keras.backend.standardize_dtype(x.dtype)


def _broadcasts(shape, expected):
    if len(shape) > len(expected):
        return False
    tail = expected[len(expected) - len(shape) :]
    return all(
        a in (1, b) or a is None or b is None
        for a, b in zip(shape, tail, strict=True)
    )


def _same(shape, expected):
    return len(shape) == len(expected) and all(
        a == b or a is None or b is None
        for a, b in zip(shape, expected, strict=True)
    )


class Positioned:
    """A mod called with sequence positions instead of tensor indices:
    query `i` at position `query_start + i`, key `j` at `key_start + j`
    (a cached step; a rolling cache's empty slots, before position 0, are
    given position 0, and are hidden anyway)."""

    def __init__(self, mod, query_start, key_start):
        self.mod = mod
        self.query_start, self.key_start = query_start, key_start

    def __call__(self, *args):
        *rest, q_idx, kv_idx = args
        q_idx = q_idx + ops.cast(self.query_start, "int32")
        kv_idx = ops.maximum(kv_idx + ops.cast(self.key_start, "int32"), 0)
        return self.mod(*rest, q_idx, kv_idx)

    @property
    def offset(self):
        """The query position minus the key position of equal indices."""
        if isinstance(self.key_start, int) and self.key_start == 0:
            return self.query_start
        return self.query_start - self.key_start

    def rewrapped(self, mod):
        """`mod` at the same positions."""
        return Positioned(mod, self.query_start, self.key_start)


def positioned(mod, query_start=None, key_start=None):
    """`mod` at sequence positions (see `Positioned`); as it is when both
    starts are `None` or 0."""
    if mod is None or all(
        start is None or (isinstance(start, int) and start == 0)
        for start in (query_start, key_start)
    ):
        return mod
    return Positioned(mod, query_start or 0, key_start or 0)


class Combined:
    """Mask mods of which every one (`conjunction`) or any one must allow
    a key (`mods.and_masks`, `mods.or_masks`)."""

    def __init__(self, mods, conjunction=True):
        self.mods, self.conjunction = list(mods), conjunction

    def __call__(self, batch, head, q_idx, kv_idx):
        combine = ops.logical_and if self.conjunction else ops.logical_or
        result = None
        for mod in self.mods:
            visible = mod(batch, head, q_idx, kv_idx)
            result = visible if result is None else combine(result, visible)
        return result


class Chained:
    """Score mods applied one after the other."""

    def __init__(self, mods):
        self.mods = list(mods)

    def __call__(self, score, *indices):
        for mod in self.mods:
            score = mod(score, *indices)
        return score


def chained(*mods):
    """The score mods that are not `None`, one after the other (or the
    only one, or `None`)."""
    mods = [m for m in mods if m is not None]
    if len(mods) <= 1:
        return mods[0] if mods else None
    return Chained(mods)


def as_mod(mod):
    """A Keras layer is called through its `call` (its inputs stay
    float32 under a mixed-precision policy); any other mod as it is."""
    if isinstance(mod, keras.Layer):
        return mod.call
    return mod
