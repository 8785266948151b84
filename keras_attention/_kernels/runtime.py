"""Backend-specific pieces of running programs: gradient recording,
whole-program compilation, and reading an index that may be traced."""

import contextlib

import keras
import numpy as np


def without_gradients():
    """A context that stops recording gradients (PyTorch's autograd graph;
    nothing to do on JAX and TensorFlow, which record only when asked)."""
    if keras.backend.backend() == "torch":
        import torch

        return torch.no_grad()
    return contextlib.nullcontext()


def compile_function(fn):
    """`fn` compiled as a whole program: `jax.jit` on JAX, an XLA
    `tf.function` on TensorFlow. PyTorch has no compiler that traces Keras
    layers without graph breaks; `fn` runs eagerly there."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.jit(fn)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True, autograph=False)
    return fn


def programs_take_variables() -> bool:
    """Whether a compiled program must receive the Keras variables it reads
    as arguments (JAX's functional programs) rather than read them itself
    (TensorFlow's graphs, PyTorch's eager loop)."""
    return keras.backend.backend() == "jax"


def static_int(value):
    """The value of an integer scalar if it is known now, else `None`.

    Python and NumPy integers, 0-d arrays, variables and concrete (eager)
    tensors in host memory have a value. A tensor being traced
    (`jax.jit`, a `tf.function` graph), a `KerasTensor` and a tensor on an
    accelerator have none: reading the last back would synchronise the
    device at every decoding step.
    """
    if value is None or isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, np.ndarray):
        return int(value) if value.ndim == 0 else None
    if isinstance(value, keras.KerasTensor) or len(value.shape) != 0:
        return None
    if isinstance(value, keras.Variable):
        value = value.value
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        if isinstance(value, jax.core.Tracer):
            return None
        if any(device.platform != "cpu" for device in value.devices()):
            return None
        return int(value)
    if backend == "tensorflow":
        import tensorflow as tf

        if tf.executing_eagerly():
            return int(value.numpy())
        known = tf.get_static_value(value)
        return None if known is None else int(known)
    if value.device.type != "cpu":
        return None
    return int(value.item())
