"""Attention on an NVIDIA GPU in bfloat16: ours against the raw fused op.

For the JAX and PyTorch backends, one process each (`gpu_check.py` runs
both, after the GPU tests):

    KERAS_BACKEND=jax python benchmarks/gpu.py [--quick] [--output PATH]
        [--budget-s SECONDS]

measures in one process, with 16384 tokens a batch (B = 16, 4, 1 at
T = 1024, 4096, 16384) and 16 heads of 64 or 128, causal and not:

* `attention` rows: the bfloat16 forward and forward + backward of
  `functional.scaled_dot_product_attention` as dispatched (the path it
  takes is recorded) and of the raw fused op in the same process,
  `jax.nn.dot_product_attention(implementation="cudnn")` or
  `torch.nn.functional.scaled_dot_product_attention`: ms, TFLOP/s, the
  kernels each ran (the cuDNN calls in JAX's compiled program, the
  operators in PyTorch's profile) and ours / raw;
* `layer` rows: a `MultiHeadSelfAttention` training step under
  `mixed_bfloat16` (the four projections, SGD on a mean squared error):
  ms, tokens/s and TFLOP/s;
* `generation` rows: greedy generation with our KV cache (the model of
  `generation.py`, its compiled loop) at batch 1 and 64: tokens/s;
* `mods` rows: attention with a mask mod (8 documents, chunks, a
  prefix-LM mask), forward and backward, as dispatched, as a dense mask
  and, on PyTorch, through FlexAttention (compiled): ms, and FlexAttention's
  largest difference from the dispatched path.

Attention FLOPs are those of its two matmuls, 4·B·N·T²·H (half of it
causal); the backward does 2.5 times the forward's, as FlashAttention's
papers count; a layer step adds 24·B·T·D² for the projections.

The most telling jobs run first (T = 4096). With `--budget-s`, a job
that would start once the budget is spent is listed under `skipped`.
The JSON (`benchmarks/results/gpu_<backend>.json` unless `--output`) is
written again after every job, so a run stopped from outside keeps what
it measured. Without a GPU, or with `--quick`, it runs at tiny sizes on
the CPU: that checks the script, not the speed.
"""

import argparse
import math
import re
import statistics
import time
from dataclasses import dataclass

import keras
from common import BACKEND
from common import block
from common import write

import keras_attention as ka
from keras_attention import functional


@dataclass(frozen=True)
class Sizes:
    tokens: int  # B·T of every attention and layer job
    heads: int
    lengths: tuple  # the first is measured first, and most fully
    head_dims: tuple
    causal: tuple
    batches: tuple  # of generation
    new_tokens: int


GPU_SIZES = Sizes(
    16384, 16, (4096, 16384, 1024), (128, 64), (False, True), (1, 64), 128
)
QUICK_SIZES = Sizes(256, 2, (128,), (16,), (True,), (1,), 8)


def device():
    """`(name, on_gpu, versions)` of the device the backend computes on."""
    if BACKEND == "jax":
        import jax

        first = jax.devices()[0]
        versions = {"jax": jax.__version__}
        return first.device_kind, first.platform == "gpu", versions
    import torch

    versions = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
    }
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0), True, versions
    return "cpu", False, versions


def raw_op(causal, gpu):
    """The backend's own fused attention on `(B, T, N, H)` inputs."""
    if BACKEND == "jax":
        import jax

        implementation = "cudnn" if gpu else None
        return lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, is_causal=causal, implementation=implementation
        )
    import torch.nn.functional as F

    def torch_sdpa(q, k, v):  # torch wants (B, N, T, H)
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return out.transpose(1, 2)  # (B, T, N, H)

    return torch_sdpa


def with_backward(fn):
    """fn's forward and the gradients of sum(out) for q, k and v."""
    if BACKEND == "jax":
        import jax

        return jax.grad(
            lambda q, k, v: fn(q, k, v).astype("float32").sum(), (0, 1, 2)
        )

    def step(q, k, v):
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        fn(q, k, v).float().sum().backward()
        return q.grad, k.grad, v.grad

    return step


def prepared(fn, args):
    """`(call, kernels)`: `call()` runs `fn(*args)` as the backend runs
    it (compiled on JAX, eagerly on PyTorch); `kernels` names the
    attention kernels it ran."""
    if BACKEND == "jax":
        import jax

        compiled = jax.jit(fn).lower(*args).compile()
        found = re.findall(r"__cudnn\$fmha\w*", compiled.as_text() or "")
        return (lambda: compiled(*args)), sorted(set(found)) or ["xla"]
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as profile:
        block(fn(*args))
    names = {event.key for event in profile.key_averages()}
    kernels = sorted(
        name
        for name in names
        if "scaled_dot_product" in name
        and name != "aten::scaled_dot_product_attention"
    )
    return (lambda: fn(*args)), kernels


def seconds_per_call(call, rounds=5, round_s=0.02):
    """Median time of one `call()`, timed over rounds of back-to-back
    calls (at least `round_s` a round), after a warm-up call."""
    block(call())
    start = time.perf_counter()
    block(call())
    once = time.perf_counter() - start
    calls = max(1, min(100, math.ceil(round_s / max(once, 1e-9))))
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls - 1):
            call()
        block(call())
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def attention_flops(batch, heads, length, head_dim, causal):
    return 4 * batch * heads * length**2 * head_dim * (0.5 if causal else 1)


def attention_job(sizes, gpu, length, head_dim, causal):
    batch = sizes.tokens // length
    shape = (batch, length, sizes.heads, head_dim)  # (B, T, N, H)
    q, k, v = (
        keras.random.normal(shape, dtype="bfloat16", seed=i) for i in range(3)
    )
    flops = attention_flops(batch, sizes.heads, length, head_dim, causal)
    row = {
        "kind": "attention",
        "length": length,
        "batch": batch,
        "heads": sizes.heads,
        "head_dim": head_dim,
        "causal": causal,
        "path": functional.explain(q, k, v, is_causal=causal).path,
    }

    def ours(q, k, v):
        return functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal
        )

    for label, fn in (("ours", ours), ("raw", raw_op(causal, gpu))):
        for part, f, factor in (
            ("fwd", fn, 1.0),
            ("fwdbwd", with_backward(fn), 3.5),
        ):
            call, kernels = prepared(f, (q, k, v))
            seconds = seconds_per_call(call)
            row[f"{label}_{part}_ms"] = seconds * 1e3
            row[f"{label}_{part}_tflops"] = factor * flops / seconds / 1e12
            row[f"{label}_{part}_kernels"] = kernels
    for part in ("fwd", "fwdbwd"):
        ratio = row[f"ours_{part}_tflops"] / row[f"raw_{part}_tflops"]
        row[f"{part}_ours_over_raw"] = ratio
    return row


def mods_job(sizes, gpu, pattern):
    """A mask mod's attention, bfloat16, forward and backward, at the
    first length and head dim 64: as dispatched (`mod`), the same pattern
    as a dense `(B, T, S)` mask (`dense`) and, on PyTorch, through
    FlexAttention (`flex`, the fused path forced to it, compiled), with
    the largest difference of its output and q, k, v gradients from the
    dispatched path's and its first call's time (compiling included);
    the patterns are those of `mods.py`."""
    from mods import patterns

    length, head_dim = sizes.lengths[0], sizes.head_dims[-1]
    batch = sizes.tokens // length
    shape = (batch, length, sizes.heads, head_dim)  # (B, T, N, H)
    q, k, v = (
        keras.random.normal(shape, dtype="bfloat16", seed=i) for i in range(3)
    )
    mod, dense = patterns(length, batch)[pattern]  # dense: (B, T, T)
    candidates = {
        "mod": lambda q, k, v: functional.scaled_dot_product_attention(
            q, k, v, mask_mod=mod
        ),
        "dense": lambda q, k, v: functional.scaled_dot_product_attention(
            q, k, v, mask=dense
        ),
    }
    row = {
        "kind": "mods",
        "pattern": pattern,
        "length": length,
        "batch": batch,
        "heads": sizes.heads,
        "head_dim": head_dim,
        "path": functional.explain(q, k, v, mask_mod=mod).path,
    }
    if BACKEND == "torch" and gpu:
        candidates["flex"] = forced_flex(candidates["mod"])
    elif BACKEND == "torch":
        row["flex"] = "not run: PyTorch has no backward pass for it on a CPU"
    results = {}
    for label, fn in candidates.items():
        call, _ = prepared(with_backward(fn), (q, k, v))
        start = time.perf_counter()
        grads = block(call())
        row[f"{label}_first_call_s"] = time.perf_counter() - start
        row[f"{label}_fwdbwd_ms"] = seconds_per_call(call) * 1e3
        results[label] = (fn(q, k, v), *grads)
    for label in candidates:
        if label != "mod":
            row[f"mod_over_{label}"] = (
                row[f"{label}_fwdbwd_ms"] / row["mod_fwdbwd_ms"]
            )
    if "flex" in results:
        ops = keras.ops
        row["flex_largest_difference"] = max(
            float(
                ops.max(
                    ops.abs(ops.cast(a, "float32") - ops.cast(b, "float32"))
                )
            )
            for a, b in zip(results["flex"], results["mod"], strict=True)
        )
    return row


def forced_flex(fn):
    """`fn` with the fused path forced through FlexAttention."""
    from keras_attention import _kernels

    def flex(q, k, v):
        with _kernels.force("fused", flex="compiled"):
            return fn(q, k, v)

    return flex


def layer_job(sizes, gpu, length, head_dim, causal):
    batch = sizes.tokens // length
    dim = sizes.heads * head_dim
    layer = ka.MultiHeadSelfAttention(
        sizes.heads, head_dim, dtype="mixed_bfloat16"
    )
    inputs = keras.Input((length, dim), batch_size=batch)
    model = keras.Model(inputs, layer(inputs, use_causal_mask=causal))
    model.compile(optimizer="sgd", loss="mse")
    x = keras.random.normal((batch, length, dim), seed=1)  # on the device
    seconds = seconds_per_call(lambda: model.train_on_batch(x, x), rounds=3)
    flops = 3.5 * attention_flops(batch, sizes.heads, length, head_dim, causal)
    flops += 24 * batch * length * dim**2
    return {
        "kind": "layer",
        "length": length,
        "batch": batch,
        "heads": sizes.heads,
        "head_dim": head_dim,
        "causal": causal,
        "step_ms": seconds * 1e3,
        "tokens_per_s": batch * length / seconds,
        "tflops": flops / seconds / 1e12,
    }


_GENERATION_MODELS = {}


def generation_job(sizes, gpu, batch):
    from generation import Model
    from generation import generator

    if "model" not in _GENERATION_MODELS:
        keras.config.set_dtype_policy("mixed_bfloat16")
        try:
            model = Model("ours_cached", sizes.new_tokens + 1)
        finally:
            keras.config.set_dtype_policy("float32")
        _GENERATION_MODELS["model"] = model
    model = _GENERATION_MODELS["model"]
    generate = generator(model, "compiled", sizes.new_tokens)
    seconds = seconds_per_call(lambda: generate(batch), rounds=3, round_s=0)
    return {
        "kind": "generation",
        "batch": batch,
        "new_tokens": sizes.new_tokens,
        "loop": "compiled",
        "policy": "mixed_bfloat16",
        "tokens_per_s": batch * sizes.new_tokens / seconds,
    }


def jobs(sizes):
    """`(name, job, arguments)`, the most telling first: attention at the
    first length, a causal layer step and generation there, then the
    other lengths, then the other layer steps."""
    first, *others = sizes.lengths
    grid = [(d, c) for d in sizes.head_dims for c in sizes.causal]
    listed = [(attention_job, (first, d, c)) for d, c in grid]
    typical = (first, sizes.head_dims[0], sizes.causal[-1])  # causal
    listed.append((layer_job, typical))
    listed.append((mods_job, ("document",)))
    listed += [(generation_job, (batch,)) for batch in sizes.batches]
    listed += [(mods_job, (pattern,)) for pattern in ("chunked", "prefix_lm")]
    listed += [(attention_job, (t, d, c)) for t in others for d, c in grid]
    listed += [
        (layer_job, (t, d, c))
        for t in sizes.lengths
        for d, c in grid
        if (t, d, c) != typical
    ]
    return [
        (f"{job.__name__[:-4]} {' '.join(map(str, args))}", job, args)
        for job, args in listed
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output", help="the JSON file to write")
    parser.add_argument("--budget-s", type=float, default=None)
    args = parser.parse_args()
    start = time.perf_counter()
    name, gpu, versions = device()
    sizes = QUICK_SIZES if args.quick or not gpu else GPU_SIZES
    payload = {
        "device": name,
        "gpu": gpu,
        "versions": versions,
        "quick": sizes == QUICK_SIZES,
        "dtype": "bfloat16",
        "tokens_per_batch": sizes.tokens,
        "budget_s": args.budget_s,
        "rows": [],
        "skipped": [],
        "failed": [],
    }
    durations = []
    for label, job, job_args in jobs(sizes):
        elapsed = time.perf_counter() - start
        needed = statistics.mean(durations) if durations else 0.0
        if args.budget_s is not None and elapsed + needed > args.budget_s:
            payload["skipped"].append(label)
            print(f"skipped {label}: the budget is spent", flush=True)
            continue
        job_start = time.perf_counter()
        try:
            row = job(sizes, gpu, *job_args)
        except Exception as error:  # keep measuring the other jobs
            payload["failed"].append(f"{label}: {error!r}"[:500])
            print(f"FAILED {label}: {error!r}", flush=True)
            row = None
        durations.append(time.perf_counter() - job_start)
        if row is not None:
            row["seconds"] = round(durations[-1], 1)  # compiling included
            payload["rows"].append(row)
            print(f"{label}: {row}", flush=True)
        payload["seconds"] = time.perf_counter() - start
        write("gpu", payload, path=args.output, quiet=True)
    path = write("gpu", payload, path=args.output)
    if payload["failed"]:
        raise SystemExit(f"{len(payload['failed'])} jobs failed; see {path}")


if __name__ == "__main__":
    main()
