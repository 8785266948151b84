"""Shared benchmark helpers: timing, compilation, machine facts, JSON.

Every benchmark runs on the backend of `KERAS_BACKEND` (one process per
backend), measures all candidates side by side in one run and reports
medians and ratios: the machine is shared and absolute times drift.
"""

import json
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
if os.environ.get("KERAS_BACKEND") == "torch":
    import torch  # noqa: F401  (torch before tensorflow)

import keras  # noqa: E402
import numpy as np  # noqa: E402

RESULTS = Path(__file__).parent / "results"
BACKEND = keras.backend.backend()


def compiled(fn):
    """The backend's compiled form of `fn`, as a user would run it."""
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True)
    return fn


def gradient_step(loss, *inputs):
    """`fn()`: the gradients of `loss(*inputs)` for each of `inputs`
    (the query, key and value, say), compiled as Keras compiles a
    training step on CPU (`jax.jit`; a TensorFlow graph without XLA;
    PyTorch eagerly)."""
    if BACKEND == "jax":
        import jax

        grads = jax.jit(jax.grad(loss, argnums=tuple(range(len(inputs)))))
        return lambda: grads(*inputs)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        @tf.function  # as Keras compiles a step on CPU: no XLA
        def grads(*inputs):
            with tf.GradientTape() as tape:
                tape.watch(inputs)
                value = loss(*inputs)
            return tape.gradient(value, inputs)

        return lambda: grads(*inputs)
    import torch

    inputs = [x.detach().requires_grad_() for x in inputs]
    return lambda: torch.autograd.grad(loss(*inputs), inputs)


def attention_step(shape, causal, path=None):
    """`fn()`: forward and backward of `scaled_dot_product_attention` on
    random `(B, T, N, H)` heads of `shape` (`gradient_step`), on `path`
    forced, or on the path the dispatch picks."""
    from keras_attention import _kernels
    from keras_attention import functional

    rng = np.random.default_rng(0)
    q, k, v, cotangent = (
        keras.ops.convert_to_tensor(rng.normal(size=shape).astype("float32"))
        for _ in range(4)
    )

    def loss(q, k, v):
        out = functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return keras.ops.sum(out * cotangent)

    if path is None:
        return gradient_step(loss, q, k, v)

    def forced(q, k, v):
        with _kernels.force(path):
            return loss(q, k, v)

    return gradient_step(forced, q, k, v)


def block(result):
    """Waits for `result` (any nest of tensors) to be computed."""
    for leaf in keras.tree.flatten(result):
        if hasattr(leaf, "block_until_ready"):  # JAX dispatches async
            leaf.block_until_ready()
        elif BACKEND == "tensorflow" and hasattr(leaf, "numpy"):
            leaf.numpy()
    if BACKEND == "torch":
        import torch

        if torch.cuda.is_available():  # so does PyTorch on a GPU
            torch.cuda.synchronize()
    return result


def median_seconds(fn, repeats=5, warmup=1):
    """Median wall time of `fn()` after `warmup` calls (compilation)."""
    for _ in range(warmup):
        block(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        block(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_medians(fns, repeats=5, warmup=1):
    """`{name: median seconds}` of each `fns[name]()`, the candidates
    timed in turn within each repeat, in reverse order every other
    repeat, so that load on a shared machine and the cost of following
    another candidate (caches, allocator) fall on all of them alike."""
    for fn in fns.values():
        for _ in range(warmup):
            block(fn())
    times = {name: [] for name in fns}
    for repeat in range(repeats):
        order = list(fns.items())
        for name, fn in order if repeat % 2 == 0 else reversed(order):
            start = time.perf_counter()
            block(fn())
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def matmul_gflops(size=2048, repeats=10):
    """The machine's float32 matmul throughput through this backend: the
    best of `repeats` runs, the practical limit every result is set
    against."""
    rng = np.random.default_rng(0)
    a = keras.ops.convert_to_tensor(rng.normal(size=(size, size)), "float32")
    b = keras.ops.convert_to_tensor(rng.normal(size=(size, size)), "float32")
    matmul = compiled(lambda x, y: keras.ops.matmul(x, y))
    block(matmul(a, b))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        block(matmul(a, b))
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def machine():
    return {
        "backend": BACKEND,
        "keras": keras.__version__,
        "processor": _cpu_name(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_average": os.getloadavg()[0],
    }


def _cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write(name, payload, path=None, quiet=False):
    """Writes the machine's facts and `payload` as JSON to `path`, by
    default `results/<name>_<backend>.json`."""
    path = Path(path) if path else RESULTS / f"{name}_{BACKEND}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**machine(), **payload}, indent=2))
    if not quiet:
        print(f"wrote {path}")
    return path
