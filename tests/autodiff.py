"""Gradients of every input and every trainable weight, taken with each
backend's own autodiff (as users' training takes them), and the float64
NumPy reference of scaled dot-product attention with its gradients."""

import contextlib

import keras
import numpy as np
from keras import ops

from keras_attention import _kernels
from tests.helpers import BACKEND
from tests.helpers import np_sdpa

KERNEL_PATHS = tuple(_kernels.PATHS)  # reference, chunked, fused
SMALL_CHUNK = 3  # several chunks, the last one partial, at short lengths


def path_context(path):
    """Forces a kernel path; `flex` is the fused path through PyTorch's
    FlexAttention, uncompiled (the lowering; `benchmarks/gpu.py` compares
    the compiled kernel); `auto` and `symbolic` use the dispatch."""
    if path == "flex":
        return _kernels.force("fused", flex="eager")
    if path in KERNEL_PATHS:
        chunk = SMALL_CHUNK if path == "chunked" else None
        return _kernels.force(path, chunk_size=chunk)
    return contextlib.nullcontext()


def flex_trains() -> bool:
    """Whether FlexAttention has a backward pass here (PyTorch on a GPU;
    on a CPU, PyTorch has none): then the gradient tests run it as a path
    of its own."""
    if BACKEND != "torch":
        return False
    import torch

    return torch.cuda.is_available()


def float64_context():
    """A context in which the backend computes in float64 (JAX disables
    64-bit types unless asked)."""
    if BACKEND == "jax":
        import jax

        return jax.enable_x64(True)
    return contextlib.nullcontext()


def value_and_grads(fn, inputs, variables=(), seed=0, copies=1):
    """Outputs of `fn(*inputs)` and the gradients of `Σ c · outputs`.

    `c` are fixed random cotangents (a plain sum would hide errors that
    cancel across a softmax row). `inputs` are NumPy arrays; `variables`
    Keras variables. Returns `(outputs, input_grads, variable_grads)` as
    float64 NumPy arrays; a gradient the backend does not deliver is
    `None`. With `copies=n` the outputs are `n` copies of one computation
    (several paths in one program), and each copy gets the cotangents a
    single computation would get.
    """

    def cotangents_of(outputs):
        """The cotangents for these outputs (their shapes are static, also
        while JAX traces)."""
        shapes = [tuple(o.shape) for o in outputs]
        return cotangents(shapes[: len(shapes) // copies], seed) * copies

    outputs, grads = _BACKENDS[BACKEND](
        fn, inputs, list(variables), cotangents_of
    )
    as_numpy = [None if g is None else _numpy(g) for g in grads]
    return (
        [_numpy(o) for o in outputs],
        as_numpy[: len(inputs)],
        as_numpy[len(inputs) :],
    )


def cotangents(shapes, seed=0):
    """The fixed random cotangents `value_and_grads` uses for outputs of
    these shapes."""
    generator = np.random.default_rng(seed)
    return [generator.standard_normal(shape) for shape in shapes]


def _loss(outputs, cotangents):
    total = 0.0
    for output, cotangent in zip(outputs, cotangents, strict=True):
        dtype = "float64" if output.dtype == "float64" else "float32"
        product = ops.cast(output, dtype) * ops.cast(cotangent, dtype)
        total = total + ops.sum(product)
    return total


def _jax(fn, inputs, variables, cotangents_of):
    import jax

    def loss(xs, values):
        mapping = list(zip(variables, values, strict=True))
        with keras.StatelessScope(state_mapping=mapping):
            outputs = keras.tree.flatten(fn(*xs))
        return _loss(outputs, cotangents_of(outputs)), outputs

    values = [v.value for v in variables]
    xs = [ops.convert_to_tensor(x) for x in inputs]
    # Compiled, as JAX training runs (and far cheaper than op by op).
    grad = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))
    (input_grads, variable_grads), outputs = grad(xs, values)
    return outputs, [*input_grads, *variable_grads]


def _tensorflow(fn, inputs, variables, cotangents_of):
    import tensorflow as tf

    xs = [tf.convert_to_tensor(x) for x in inputs]
    with tf.GradientTape() as tape:
        tape.watch(xs)
        outputs = keras.tree.flatten(fn(*xs))
        loss = _loss(outputs, cotangents_of(outputs))
    grads = tape.gradient(loss, [*xs, *(v.value for v in variables)])
    return outputs, grads


def _torch(fn, inputs, variables, cotangents_of):
    xs = [
        ops.convert_to_tensor(x).detach().requires_grad_(True) for x in inputs
    ]
    for variable in variables:
        variable.value.grad = None
    outputs = keras.tree.flatten(fn(*xs))
    _loss(outputs, cotangents_of(outputs)).backward()
    return outputs, [*(x.grad for x in xs), *(v.value.grad for v in variables)]


_BACKENDS = {"jax": _jax, "tensorflow": _tensorflow, "torch": _torch}


def _numpy(x):
    return np.asarray(
        keras.ops.convert_to_numpy(
            ops.cast(x, "float64" if x.dtype == "float64" else "float32")
        ),
        "float64",
    )


def np_sdpa_grads(
    q,
    k,
    v,
    mask,
    causal,
    cotangent,
    scale=None,
    soft_cap=None,
    bias=None,
    bias_grad=False,
):
    """Float64 reference: output of attention and the gradients of
    `Σ cotangent · output` w.r.t. `q`, `k`, `v` (3-D, 4-D, grouped), with
    an optional logit soft cap and additive bias `(N, T, S)` or
    `(B, N, T, S)`; with `bias_grad`, also the gradient of the bias
    `(B, N, T, S)`."""
    q, k, v, dout = (np.asarray(x, "float64") for x in (q, k, v, cotangent))
    single = q.ndim == 3
    if single:
        q, k, v, dout = (x[:, :, None] for x in (q, k, v, dout))
    out, weights = np_sdpa(q, k, v, mask, causal, scale, soft_cap, bias)
    batch, _, n, h = q.shape
    s, kv_heads = k.shape[1], k.shape[2]
    groups = n // kv_heads
    kr, vr = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
    scale = 1.0 / np.sqrt(h) if scale is None else scale
    dweights = np.einsum("btnv,bsnv->bnts", dout, vr)
    dvr = np.einsum("bnts,btnv->bsnv", weights, dout)
    dlogits = weights * (dweights - (weights * dweights).sum(-1, keepdims=True))
    dbias = dlogits
    if soft_cap is not None:  # through the cap's tanh
        raw = np.einsum("btnh,bsnh->bnts", q, kr) * scale
        dlogits = dlogits * (1.0 - np.tanh(raw / soft_cap) ** 2)
    dq = np.einsum("bnts,bsnh->btnh", dlogits, kr) * scale
    dkr = np.einsum("bnts,btnh->bsnh", dlogits, q) * scale
    dk = dkr.reshape(batch, s, kv_heads, groups, h).sum(3)
    dv = dvr.reshape(batch, s, kv_heads, groups, -1).sum(3)
    extra = (dbias,) if bias_grad else ()
    if single:
        return out[:, :, 0], dq[:, :, 0], dk[:, :, 0], dv[:, :, 0], *extra
    return out, dq, dk, dv, *extra


# Largest errors seen against the float64 reference, per (what, dtype):
# `[cases, forward error, gradient error]`, printed after the run.
RECORD = {}

TOLERANCES = {  # (forward, gradient), relative to max(1, |reference|)
    "float32": (2e-5, 1e-4),
    "float16": (1e-2, 3e-2),
    "bfloat16": (4e-2, 1.5e-1),
}


def error(actual, reference):
    """`max |actual - reference|`, relative to `max(1, max |reference|)`."""
    reference = np.asarray(reference, "float64")
    scale = max(1.0, float(np.abs(reference).max(initial=0.0)))
    return float(np.abs(np.asarray(actual) - reference).max()) / scale


def assert_close(what, dtype, outputs, grads, ref_outputs, ref_grads, names):
    """Every output and every gradient within the dtype's tolerance of the
    reference; records the largest errors under `what`."""
    forward_tol, grad_tol = TOLERANCES[dtype]
    forward = max(
        error(a, b) for a, b in zip(outputs, ref_outputs, strict=True)
    )
    missing = [n for n, g in zip(names, grads, strict=True) if g is None]
    assert not missing, f"{what}: no gradient reached {missing}"
    grad_errors = {
        name: error(a, b)
        for name, a, b in zip(names, grads, ref_grads, strict=True)
    }
    worst = max(grad_errors.values(), default=0.0)
    cases, old_forward, old_grad = RECORD.get((what, dtype), (0, 0.0, 0.0))
    RECORD[(what, dtype)] = (
        cases + 1,
        max(old_forward, forward),
        max(old_grad, worst),
    )
    assert forward <= forward_tol, f"{what} {dtype}: forward error {forward}"
    bad = {n: e for n, e in grad_errors.items() if e > grad_tol}
    assert not bad, f"{what} {dtype}: gradient errors {bad}"
