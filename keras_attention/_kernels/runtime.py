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


def scan_carries(f, init, xs):
    """Runs `carry = f(carry, x)` along the leading axis of `xs` (a nested
    structure) from `init`, and returns every carry stacked on a new
    leading axis.

    `keras.ops.scan`, except on TensorFlow: there `tf.scan` keeps the
    carry in loop tensors, where Keras's scan keeps it in TensorArrays,
    which tf2onnx cannot convert to ONNX.
    """
    if keras.backend.backend() != "tensorflow":
        return keras.ops.scan(lambda c, x: (f(c, x),) * 2, init, xs)[1]
    import tensorflow as tf

    return tf.scan(f, xs, initializer=init)


def programs_take_variables() -> bool:
    """Whether a compiled program must receive the Keras variables it reads
    as arguments (JAX's functional programs) rather than read them itself
    (TensorFlow's graphs, PyTorch's eager loop)."""
    return keras.backend.backend() == "jax"


def static_dim(dim):
    """A dimension's size if it is a number now, else `None`.

    A dimension is unknown (`None`) in a Keras symbolic shape, symbolic
    under export (a JAX `jax.export` dimension expression, a PyTorch
    `SymInt` or a traced size): comparing those with numbers either
    fails or bakes one size into the exported program.
    """
    if isinstance(dim, (bool, np.bool_)):
        return None
    if isinstance(dim, (int, np.integer)):
        return int(dim)
    return None


def is_symbolic_dim(value) -> bool:
    """Whether `value` is a dimension known only symbolically (under
    `jax.export`, `torch.export` or the PyTorch tracer)."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.export.is_symbolic_dim(value)
    if backend == "torch":
        import torch

        return isinstance(value, (torch.SymInt, torch.Tensor))
    return False


def is_exporting() -> bool:
    """Whether PyTorch is tracing (`torch.jit.trace`, the TorchScript
    ONNX exporter) or exporting (`torch.export`) the running code."""
    if keras.backend.backend() != "torch":
        return False
    import torch

    # `torch.compiler.is_exporting` is new in PyTorch 2.7.
    exporting = getattr(torch.compiler, "is_exporting", lambda: False)
    return torch.jit.is_tracing() or exporting()


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
    import torch

    # Traced, exported or compiled, a value read back would be baked into
    # the program (or break the graph).
    if (
        value.device.type != "cpu"
        or is_exporting()
        or torch.compiler.is_compiling()
    ):
        return None
    return int(value.item())
