"""What a mod holds: the tensors and Keras variables it reads.

The blockwise path differentiates through its own backward pass, which
only sees its explicit inputs. `Bound` therefore finds the tensors and
Keras variables a mod holds (through its closure, default arguments, the
globals it names and what those hold, `functools.partial` arguments, the
attributes of an object, slots included, or a Keras layer) and calls the
mod as a function of them: its floating tensors are differentiated like
the query, key and value.
"""

import copy
import functools
import types

import keras
import numpy as np
from keras import ops

from keras_attention._core.checks import is_tensor
from keras_attention._core.mods import dtype_name


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
        self.floating = ["float" in dtype_name(x) for x in self.held]

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
        return self.apply(held, lambda mod: mod(*args))

    def apply(self, held, use):
        """`use(mod)`, with the tensors `held` (as `self.held`) in place of
        the mod's own."""
        count = len(self.variables)
        mapping = list(zip(self.variables, held[:count], strict=True))
        replaced = {
            id(old): new
            for old, new in zip(self._tensors, held[count:], strict=True)
            if new is not old
        }
        mod = _substitute(self.mod, replaced, {}) if replaced else self.mod
        with _Reads(mapping) as reads:
            result = use(mod)
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
    return list(_attributes(obj).values())


def _attributes(obj):
    """An object's attributes: its `__dict__` and its `__slots__`."""
    attributes = dict(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        slots = vars(cls).get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{cls.__name__.lstrip('_')}{name}"  # mangled
            if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                attributes[name] = getattr(obj, name)
    return attributes


def _may_hold(value):
    """Whether a global a function names may hold what a mod reads: a
    tensor or variable, a container, or another function (a helper)."""
    if isinstance(value, (types.FunctionType, functools.partial)):
        module = getattr(value, "__module__", None) or ""
        return module.split(".")[0] not in _LIBRARIES
    return is_tensor(value) or isinstance(
        value, (keras.Variable, list, tuple, dict)
    )


# Packages whose functions hold no tensors of a user's mod.
_LIBRARIES = {
    "keras",
    "keras_attention",
    "jax",
    "jaxlib",
    "torch",
    "tensorflow",
    "numpy",
    "functools",
    "builtins",
}


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
        result = obj
        if changed:  # a named tuple takes its fields one by one
            named = hasattr(obj, "_make")
            result = type(obj)._make(items) if named else type(obj)(items)
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
    elif isinstance(obj, (keras.Layer, type, types.ModuleType, np.ndarray)):
        result = obj  # a layer's variables are mapped, not replaced
    elif is_tensor(obj) or isinstance(obj, keras.Variable):
        result = obj  # a tensor not replaced
    else:
        attributes = _attributes(obj)
        changed = {
            name: new
            for name, value in attributes.items()
            if (new := _substitute(value, replaced, memo)) is not value
        }
        result = obj
        if changed:
            result = copy.copy(obj)
            if result is obj:  # a `__copy__` that returns the object itself
                result = object.__new__(type(obj))
                changed = {**attributes, **changed}
            for name, value in changed.items():
                object.__setattr__(result, name, value)  # frozen too
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
    defaults = _substitute(fn.__defaults__, replaced, memo)
    kwdefaults = _substitute(fn.__kwdefaults__, replaced, memo)
    unchanged = (
        not named
        and defaults is fn.__defaults__
        and kwdefaults is fn.__kwdefaults__
        and all(
            new.cell_contents is old.cell_contents
            for new, old in zip(cells, fn.__closure__ or (), strict=True)
        )
    )
    if unchanged:
        return fn
    scope = {**fn.__globals__, **named} if named else fn.__globals__
    result = types.FunctionType(
        fn.__code__,
        scope,
        fn.__name__,
        defaults,
        cells or None,
    )
    result.__kwdefaults__ = kwdefaults
    return result
