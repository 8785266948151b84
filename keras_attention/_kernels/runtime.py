"""The pieces of running programs that depend on the backend: gradient
recording, whole-program compilation, scans, reading a dimension or an
index that may be traced, and the distribution in effect. Each asks the
backend's primitives."""

import keras
import numpy as np

from keras_attention._core import static_dim as static_dim
from keras_attention._kernels import backends
from keras_attention.distribution import ContextParallel


def context_parallel():
    """The `ContextParallel` distribution in effect, or `None` (always on
    backends other than JAX, where Keras has no distributions)."""
    if keras.backend.backend() != "jax":
        return None
    distribution = keras.distribution.distribution()
    return distribution if isinstance(distribution, ContextParallel) else None


def sharing_objects() -> bool:
    """Whether Keras is serializing inside its object-sharing scope, as it
    does to save and load `.keras` files (Keras keeps that scope in its
    global state, which has no public accessor; `False` where it moved)."""
    try:
        from keras.src.backend.common import global_state
    except ImportError:
        return False
    return (
        global_state.get_global_attribute("shared_objects/id_to_config_map")
        is not None
    )


def without_gradients():
    """A context that stops recording gradients (PyTorch's autograd graph;
    nothing to do on JAX and TensorFlow, which record only when asked)."""
    return backends.current().without_gradients()


def compile_function(fn):
    """`fn` compiled as a whole program: `jax.jit` on JAX, an XLA
    `tf.function` on TensorFlow. PyTorch has no compiler that traces Keras
    layers without graph breaks; `fn` runs eagerly there."""
    return backends.current().compile_function(fn)


def scan_carries(f, init, xs):
    """Runs `carry = f(carry, x)` along the leading axis of `xs` (a nested
    structure) from `init`, and returns every carry stacked on a new
    leading axis (`keras.ops.scan`, except where that does not export)."""
    return backends.current().scan_carries(f, init, xs)


def top_k(x, k):
    """`(values, indices)`: the `k` largest entries of the last axis, best
    first, and among equal values the lower index first (as `argmax`
    picks), on every backend."""
    return backends.current().top_k(x, k)


def programs_take_variables() -> bool:
    """Whether a compiled program must receive the Keras variables it reads
    as arguments (JAX's functional programs) rather than read them itself
    (TensorFlow's graphs, PyTorch's eager loop)."""
    return backends.current().PROGRAMS_TAKE_VARIABLES


def is_symbolic_dim(value) -> bool:
    """Whether `value` is a dimension known only symbolically (under
    `jax.export`, `torch.export` or the PyTorch tracer)."""
    return backends.current().is_symbolic_dim(value)


def is_exporting() -> bool:
    """Whether PyTorch is tracing (`torch.jit.trace`, the TorchScript
    ONNX exporter) or exporting (`torch.export`) the running code."""
    return backends.current().is_exporting()


def static_int(value):
    """The value of an integer scalar if it is known now, else `None`.

    Python and NumPy integers, 0-d arrays, variables and concrete (eager)
    tensors in host memory have a value. A tensor being traced
    (`jax.jit`, a `tf.function` graph, PyTorch's tracer, `torch.export`
    or `torch.compile`), a `KerasTensor` and a tensor on an accelerator
    have none: reading the last back would synchronise the device at
    every decoding step.
    """
    if value is None or isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, np.ndarray):
        return int(value) if value.ndim == 0 else None
    if isinstance(value, keras.KerasTensor) or len(value.shape) != 0:
        return None
    known = static_array(value)
    return None if known is None else int(known)


def static_array(value):
    """The value of a tensor as a NumPy array if it is known now (as
    `static_int` reads it), else `None`."""
    if isinstance(value, keras.KerasTensor):
        return None
    if isinstance(value, keras.Variable):
        value = value.value
    if not keras.ops.is_tensor(value):
        return np.asarray(value)  # host data: NumPy, Python numbers
    return backends.current().host_array(value)
