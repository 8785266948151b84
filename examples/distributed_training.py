"""Training the Transformer examples on several devices, on every backend.

Trains the mini GPT of `mini_gpt.py` (decoder-only, rotary positions,
grouped-query attention) and the encoder-decoder Transformer of
`transformer_nmt.py` on one device (the baseline) and on several with the
backend's own engine, from the same initial weights on the same batches in
the same order, and compares the losses and the final weights:

* JAX: `keras.distribution` (implemented for JAX only in Keras 3.15).
  `DataParallel` replicates the variables and splits every batch across
  all devices. `ModelParallel` splits batches along "batch" of a
  `(batch, model)` device mesh and, by `LAYOUTS` below, attention heads
  and feed-forward units along "model" (Megatron-style tensor
  parallelism: XLA inserts the all-reduce after the output projections);
  the devices on "model" must divide the query and key/value heads.
* TensorFlow: `tf.distribute.MirroredStrategy`. The model is built and
  compiled inside `strategy.scope()` and trained by the same `fit`: each
  replica takes its slice of every batch, Keras divides each replica's
  loss by the number of replicas, and the gradients are summed.
* PyTorch: `torch.nn.parallel.DistributedDataParallel` (DDP), one process
  per device, started by `torch.multiprocessing`. A Keras model on torch
  is a `torch.nn.Module`, which DDP wraps as it is. Each process takes its
  slice of every batch, and a plain torch loop does what Keras's torch
  `train_step` does: the forward pass through the wrapper, the compiled
  loss, `backward()` (where DDP averages the gradients over the
  processes), the compiled Keras optimizer. It therefore reproduces `fit`.

Splitting a batch reproduces the whole batch when every replica's loss is
a mean over as many terms, as here (equal slices; the dates targets have
no padding). With unequal numbers of ignored (padded) targets per replica,
the mean of the replicas' means is not the mean over the batch.

On a CPU, `--simulate-devices N` trains on N simulated devices: XLA host
devices on JAX (set in `XLA_FLAGS` before JAX is imported), logical CPU
devices on TensorFlow (set before TensorFlow initialises), processes
joined by gloo on torch. Without it the script uses the accelerators: all
JAX devices, `MirroredStrategy()` over all GPUs, one process per GPU
joined by nccl.

    python examples/distributed_training.py --backend jax --simulate-devices 8
    python examples/distributed_training.py --backend tensorflow \\
        --simulate-devices 2
    python examples/distributed_training.py --backend torch --simulate-devices 2
    python examples/distributed_training.py --backend jax  # accelerators

The last line printed is a JSON summary; the exit status is 1 if a
distributed run's losses over the first `--check-steps` steps differ from
the single-device run's by more than `--tolerance`: a wrong split of the
batch, the heads or the gradients shows from the first step. The largest
differences over the whole run, of the losses and of the final weights,
are printed too. They grow with float32 rounding, which training
amplifies: splitting a batch changes only the order of the sums, and
after some tens of steps the NMT model's runs drift apart by about as
much as two single-device runs that differ only in their matmul
library's rounding.
"""

import argparse
import datetime
import functools
import gc
import json
import operator
import os
import sys
import tempfile
import time
from pathlib import Path

# `ModelParallel` layouts on the (batch, model) mesh. The keys are regular
# expressions that must match a whole `variable.path` (list the paths with
# `for w in model.weights: print(w.path)`); "attention" covers
# `self_attention` and `cross_attention`. D is the model dim, N the heads
# (key/value heads for key and value), H the head dim, F the feed-forward
# units. Everything else (embeddings, LayerNorms, logits) is replicated.
LAYOUTS = {
    ".*attention/(query|key|value)_dense/kernel": (None, "model", None),  # DNH
    ".*attention/(query|key|value)_dense/bias": ("model", None),  # (N, H)
    ".*attention/output_dense/kernel": ("model", None, None),  # (N, H, D)
    ".*feedforward_intermediate_dense/kernel": (None, "model"),  # (D, F)
    ".*feedforward_intermediate_dense/bias": ("model",),  # (F,)
    ".*feedforward_output_dense/kernel": ("model", None),  # (F, D)
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--backend", choices=("jax", "tensorflow", "torch"), default=None
    )
    parser.add_argument(
        "--simulate-devices",
        type=int,
        default=0,
        help="train on this many simulated CPU devices",
    )
    parser.add_argument("--models", default="gpt,nmt")
    parser.add_argument(
        "--model-shards",
        type=int,
        default=2,
        help='JAX: devices on the "model" mesh axis',
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--units", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument(
        "--adam-epsilon",
        type=float,
        default=1e-7,
        help="Adam's epsilon (Keras's default: 1e-7)",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=1e-3,
        help="largest allowed difference of a loss from the single device",
    )
    parser.add_argument(
        "--check-steps",
        type=int,
        default=10,
        help="the first steps whose losses must be within --tolerance",
    )
    parser.add_argument("--output", default="examples/output")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="seconds-long run")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.batch_size, args.units = 3, 16, 16
        args.layers, args.sequence_length = 1, 16
    return args


def gpt_task(args):
    """The mini GPT and `(inputs, targets)` windows of stdlib docstrings."""
    import numpy as np

    from examples import mini_gpt

    _, _, data, _ = mini_gpt.load_corpus(max_files=40)
    rng = np.random.default_rng(args.seed)
    x, y = mini_gpt.windows(
        data["train"], args.steps * args.batch_size, args.sequence_length, rng
    )
    config = argparse.Namespace(
        units=args.units,
        heads=args.heads,
        kv_heads=args.kv_heads,
        layers=args.layers,
        positions="rotary",
        dropout=0.0,
        sequence_length=args.sequence_length,
        prompt_length=0,
        generate=0,
    )
    return functools.partial(mini_gpt.build_model, config), x, y


def nmt_task(args):
    """The encoder-decoder Transformer and teacher-forcing dates pairs."""
    from examples import seq2seq
    from keras_attention import datasets

    count = args.steps * args.batch_size
    corpus = datasets.load_dates(int(count * 1.4) + 20, seed=args.seed)
    pairs = corpus.train[:count]
    if len(pairs) < count:
        raise ValueError(f"only {len(pairs)} dates pairs; need {count}")
    source_vocab = datasets.Vocabulary.from_texts([s for s, _ in pairs], "word")
    target_vocab = datasets.Vocabulary.from_texts([t for _, t in pairs], "char")
    x, y = seq2seq.arrays(pairs, source_vocab, target_vocab)
    build = functools.partial(
        seq2seq.build_transformer,
        len(source_vocab),
        len(target_vocab),
        args.units,
        num_heads=args.heads,
        num_layers=args.layers,
        dropout=0.0,
    )
    return build, x, y


def compile_model(model, args):
    import keras

    model.compile(
        optimizer=keras.optimizers.Adam(
            args.learning_rate, epsilon=args.adam_epsilon
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, ignore_class=0
        ),
    )


def train(job, args, scope=None):
    """`(model, losses, weights, seconds)` of `model.fit` from the job's
    initial weights, inside `scope` (a distribution or strategy scope).

    The losses are the running means Keras reports after each batch.
    """
    import contextlib

    import keras
    import numpy as np

    losses = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: losses.append(logs["loss"])
    )
    with scope or contextlib.nullcontext():
        model = job["build"]()
        model.set_weights(job["initial"])
        compile_model(model, args)
        start = time.perf_counter()
        model.fit(
            job["x"],
            job["y"],
            batch_size=args.batch_size,
            epochs=1,
            shuffle=False,
            callbacks=[record],
            verbose=0,
        )
        seconds = time.perf_counter() - start
    return model, np.array(losses, "float64"), model.get_weights(), seconds


def jax_runs(job, args, devices):
    """`DataParallel` and `ModelParallel` runs over `devices`."""
    import keras

    shards = args.model_shards if len(devices) % args.model_shards == 0 else 1
    mesh = keras.distribution.DeviceMesh(
        (len(devices) // shards, shards), ("batch", "model"), devices
    )
    layout_map = keras.distribution.LayoutMap(mesh)
    for pattern, layout in LAYOUTS.items():
        layout_map[pattern] = layout
    distributions = {
        f"DataParallel ({len(devices)})": keras.distribution.DataParallel(
            devices=devices
        ),
        f"ModelParallel ({len(devices) // shards} x {shards})": (
            keras.distribution.ModelParallel(
                layout_map=layout_map, batch_dim_name="batch"
            )
        ),
    }
    runs = {}
    for label, distribution in distributions.items():
        model, losses, weights, seconds = train(job, args, distribution.scope())
        runs[label] = (losses, weights, seconds, layouts(model))
    return runs


def layouts(model):
    """`{path: sharding}` of the variables the LayoutMap shards."""
    out = {}
    for variable in model.weights:
        sharding = getattr(variable.value, "sharding", None)
        spec = getattr(sharding, "spec", None)
        if spec is not None and any(axis is not None for axis in spec):
            out[variable.path] = str(tuple(spec))
    return out


def mirrored_strategy(simulate_devices):
    """`MirroredStrategy` over all GPUs, or over `simulate_devices` logical
    CPU devices; must run before TensorFlow initialises its devices."""
    import tensorflow as tf

    if not simulate_devices:
        return tf.distribute.MirroredStrategy()
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * simulate_devices
    )
    return tf.distribute.MirroredStrategy(
        [f"/cpu:{i}" for i in range(simulate_devices)]
    )


def mirrored_runs(job, args, strategy):
    """A `fit` run with the model built and compiled in `strategy.scope()`."""
    _, losses, weights, seconds = train(job, args, strategy.scope())
    label = f"MirroredStrategy ({strategy.num_replicas_in_sync})"
    return {label: (losses, weights, seconds, {})}


def torch_runs(jobs, args, processes):
    """`{name: {label: (losses, weights, seconds, {})}}` of DDP runs over
    `processes` processes, all jobs in one group (each process imports
    torch and Keras once)."""
    import numpy as np
    import torch.multiprocessing

    with tempfile.TemporaryDirectory() as folder:
        torch.multiprocessing.spawn(
            ddp_worker, args=(processes, jobs, args, folder), nprocs=processes
        )
        runs = {}
        label = f"DistributedDataParallel ({processes})"
        for job in jobs:
            saved = np.load(Path(folder) / f"{job['name']}.npz")
            weights = [saved[f"w{i}"] for i in range(len(job["initial"]))]
            run = (saved["losses"], weights, float(saved["seconds"]), {})
            runs[job["name"]] = {label: run}
    return runs


def ddp_worker(rank, processes, jobs, args, folder):
    """One DDP process: trains every job on its slice of each batch; rank
    0 saves the losses, weights and time to `folder/<name>.npz`."""
    import torch
    import torch.distributed as dist

    gpus = torch.cuda.is_available() and not args.simulate_devices
    if gpus:
        torch.cuda.set_device(rank)  # before Keras places any tensor
    else:
        torch.set_num_threads(max(1, os.cpu_count() // processes))
    dist.init_process_group(
        "nccl" if gpus else "gloo",
        init_method=f"file://{folder}/rendezvous",
        rank=rank,
        world_size=processes,
        timeout=datetime.timedelta(minutes=2),  # a lost peer fails, not hangs
    )
    import keras
    import numpy as np

    try:
        local = args.batch_size // processes
        for job in jobs:
            model = job["build"]()
            model.set_weights(job["initial"])
            compile_model(model, args)
            parallel = torch.nn.parallel.DistributedDataParallel(model)
            losses = []
            start = time.perf_counter()
            for step in range(args.steps):
                first = step * args.batch_size + rank * local
                rows = operator.itemgetter(slice(first, first + local))
                x, y = keras.tree.map_structure(rows, (job["x"], job["y"]))
                y_pred = parallel(x, training=True)
                loss = model.compute_loss(x=x, y=y, y_pred=y_pred)
                model.zero_grad()
                loss.backward()  # DDP averages the gradients over ranks
                variables = model.trainable_variables
                with torch.no_grad():
                    model.optimizer.apply(
                        [v.value.grad for v in variables], variables
                    )
                total = loss.detach().clone()
                dist.all_reduce(total)  # the sum of the processes' losses
                losses.append(total.item() / processes)
            seconds = time.perf_counter() - start
            if rank == 0:
                np.savez(
                    Path(folder) / f"{job['name']}.npz",
                    losses=np.cumsum(losses) / np.arange(1, args.steps + 1),
                    seconds=seconds,
                    **{f"w{i}": w for i, w in enumerate(model.get_weights())},
                )
            # DDP's reducer goes first: holding the group's last reference,
            # it would run the gloo group's destructor with the GIL held,
            # which waits for gloo's threads while they may wait for the
            # GIL (pytorch/pytorch#56297): a hang at exit.
            del parallel
            gc.collect()
    finally:
        dist.destroy_process_group()


def largest_difference(a, b):
    import numpy as np

    return max(
        float(np.max(np.abs(np.asarray(u) - np.asarray(v))))
        for u, v in zip(a, b, strict=True)
    )


def engine_and_devices(backend, args):
    """The engine's name, its device names and the TensorFlow strategy."""
    if backend == "jax":
        import keras

        return "keras.distribution", keras.distribution.list_devices(), None
    if backend == "tensorflow":
        strategy = mirrored_strategy(args.simulate_devices)
        devices = strategy.extended.worker_devices
        return "tf.distribute.MirroredStrategy", devices, strategy
    import torch

    count = args.simulate_devices or torch.cuda.device_count() or 1
    if args.batch_size % count:
        raise ValueError(
            f"--batch-size {args.batch_size} must be a multiple of the "
            f"{count} processes"
        )
    devices = [f"process {rank}" for rank in range(count)]
    return "torch.nn.parallel.DistributedDataParallel", devices, None


def main(argv=None):
    from examples.backend import publish

    args = parse_args(argv)
    if args.backend:
        os.environ["KERAS_BACKEND"] = args.backend
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    if args.simulate_devices and backend == "jax":
        # Must happen before JAX is imported: it reads XLA_FLAGS once.
        if "jax" in sys.modules:
            raise RuntimeError("--simulate-devices: JAX is already imported")
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + " --xla_force_host_platform_device_count="
            + str(args.simulate_devices)
        ).strip()
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if backend == "torch":
        import torch  # noqa: F401  (before tensorflow, which can crash it)
    import keras

    engine, devices, strategy = engine_and_devices(backend, args)
    print(
        f"keras_attention distributed training on {backend} with {engine}"
        f" (Keras {keras.__version__})"
    )
    print(f"{len(devices)} devices: {', '.join(devices)}")
    if len(devices) < 2:
        print(
            "only one device: the distributed runs equal the baseline "
            "(use --simulate-devices on a CPU)"
        )
    tasks = {"gpt": gpt_task, "nmt": nmt_task}
    jobs = []
    for name in args.models.split(","):
        build, x, y = tasks[name](args)
        keras.utils.set_random_seed(args.seed)
        initial = build().get_weights()
        jobs.append(
            {"name": name, "build": build, "x": x, "y": y, "initial": initial}
        )
    if backend == "torch":
        ddp = torch_runs(jobs, args, len(devices))
    summary = {
        "backend": backend,
        "engine": engine,
        "devices": len(devices),
        "models": {},
    }
    ok = True
    for job in jobs:
        _, base_losses, base_weights, seconds = train(job, args)
        runs = {
            "single device": {
                "seconds": round(seconds, 2),
                "first_loss": float(base_losses[0]),
                "last_loss": float(base_losses[-1]),
            }
        }
        print(
            f"\n{job['name']}: {args.steps} steps of {args.batch_size} "
            f"examples; single device: loss {base_losses[0]:.4f} -> "
            f"{base_losses[-1]:.4f} ({seconds:.1f} s)"
        )
        if backend == "jax":
            distributed = jax_runs(job, args, devices)
        elif backend == "tensorflow":
            distributed = mirrored_runs(job, args, strategy)
        else:
            distributed = ddp[job["name"]]
        for label, (losses, weights, seconds, sharded) in distributed.items():
            loss_difference = largest_difference(losses, base_losses)
            weight_difference = largest_difference(weights, base_weights)
            runs[label] = {
                "seconds": round(seconds, 2),
                "first_loss": float(losses[0]),
                "last_loss": float(losses[-1]),
                "max_loss_difference": loss_difference,
                "max_weight_difference": weight_difference,
                "sharded_variables": len(sharded),
            }
            checked = min(args.check_steps, len(losses))
            early_difference = largest_difference(
                losses[:checked], base_losses[:checked]
            )
            runs[label]["max_loss_difference_checked_steps"] = early_difference
            ok = ok and early_difference <= args.tolerance
            print(
                f"  {label}: loss {losses[0]:.4f} -> {losses[-1]:.4f} "
                f"({seconds:.1f} s); max |loss - single device| = "
                f"{loss_difference:.2e}, max |weight difference| = "
                f"{weight_difference:.2e}, {len(sharded)} variables sharded"
            )
            for path, spec in list(sharded.items())[:4]:
                print(f"      {path}: {spec}")
        summary["models"][job["name"]] = {
            "steps": args.steps,
            "batch_size": args.batch_size,
            "baseline_losses": [float(v) for v in base_losses],
            "runs": runs,
        }
    summary["matches_single_device"] = ok
    output = Path(args.output) / "distributed"
    output.mkdir(parents=True, exist_ok=True)
    (output / "results.json").write_text(json.dumps(summary, indent=2))
    print("RESULT " + json.dumps(summary))
    name = f"distributed-{backend}"
    if args.models != "gpt,nmt":
        name += "-" + args.models.replace(",", "-")
    if args.adam_epsilon != 1e-7:
        name += f"-adam-epsilon-{args.adam_epsilon:g}"
    publish(name, summary, args)
    return summary


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(0 if main()["matches_single_device"] else 1)
