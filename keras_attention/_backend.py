"""The backend-specific pieces outside attention itself.

Everything else in the package is written in `keras.ops`; this module
and the fused-kernel dispatch of `functional.py` are the places that look
at the backend.
"""

import contextlib

import keras


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
