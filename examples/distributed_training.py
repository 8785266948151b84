"""Multi-device training of the Transformer examples with keras.distribution.

Trains the mini GPT of `mini_gpt.py` (decoder-only, rotary positions,
grouped-query attention) and the encoder-decoder Transformer of
`transformer_nmt.py` three times each, from the same initial weights on
the same batches in the same order, and compares the losses:

1. on one device (the baseline),
2. with `keras.distribution.DataParallel`: variables replicated, every
   batch split across all devices,
3. with `keras.distribution.ModelParallel` on a `(batch, model)` device
   mesh: batches split along "batch", attention heads and feed-forward
   units split along "model" by this `LayoutMap` (keys are regular
   expressions that must match a whole `variable.path`, as printed by
   `for w in model.weights: print(w.path)`):

    ========================================================  ================
    variable path (regex)                                     layout
    ========================================================  ================
    .*attention/(query|key|value)_dense/kernel  (D, N, H)    (None, model, None)
    .*attention/(query|key|value)_dense/bias    (N, H)       (model, None)
    .*attention/output_dense/kernel             (N, H, D)    (model, None, None)
    .*feedforward_intermediate_dense/kernel     (D, F)       (None, model)
    .*feedforward_intermediate_dense/bias       (F,)         (model,)
    .*feedforward_output_dense/kernel           (F, D)       (model, None)
    ========================================================  ================

   "attention" covers both `self_attention` and `cross_attention` of the
   blocks. Each device holds N / m query heads and K / m key/value heads
   (m devices on "model", which must divide N and K) and F / m
   feed-forward units: Megatron-style tensor parallelism, where XLA
   inserts the all-reduce after the output projections. Everything else
   (embeddings, LayerNorms, biases of the output projections, logits) is
   replicated.

Keras 3.15's distribution API is implemented for JAX only. The TensorFlow
backend has an unfinished DTensor prototype (marked "DO NOT USE"; it lays
out no variables and shards no data) and PyTorch none, so on those
backends the script says so and trains the single-device baseline only.

On a multi-GPU (or TPU) JAX host it uses the accelerators. On a CPU,
`--simulate-devices 8` makes XLA expose 8 host devices (it sets
`XLA_FLAGS=--xla_force_host_platform_device_count=8` before JAX is
imported):

    python examples/distributed_training.py --backend jax --simulate-devices 8
    python examples/distributed_training.py --backend jax   # real GPUs

The last line printed is a JSON summary; the exit status is 1 if a
distributed run's losses differ from the baseline's by more than
`--tolerance`.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

LAYOUTS = {
    ".*attention/(query|key|value)_dense/kernel": (None, "model", None),
    ".*attention/(query|key|value)_dense/bias": ("model", None),
    ".*attention/output_dense/kernel": ("model", None, None),
    ".*feedforward_intermediate_dense/kernel": (None, "model"),
    ".*feedforward_intermediate_dense/bias": ("model",),
    ".*feedforward_output_dense/kernel": ("model", None),
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
        help="JAX on CPU: expose this many host devices",
    )
    parser.add_argument("--models", default="gpt,nmt")
    parser.add_argument(
        "--model-shards",
        type=int,
        default=2,
        help='devices on the "model" mesh axis',
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--units", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--tolerance", type=float, default=1e-3)
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
    return lambda: mini_gpt.build_model(config), x, y


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

    def build():
        return seq2seq.build_transformer(
            len(source_vocab),
            len(target_vocab),
            args.units,
            num_heads=args.heads,
            num_layers=args.layers,
            dropout=0.0,
        )

    return build, x, y


def train(build, x, y, initial_weights, args, distribution=None):
    """Per-step losses and final weights of one run from `initial_weights`.

    The losses are the running means Keras reports after each batch.
    """
    import contextlib

    import keras
    import numpy as np

    losses = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: losses.append(logs["loss"])
    )
    scope = distribution.scope() if distribution else contextlib.nullcontext()
    with scope:
        model = build()
        model.set_weights(initial_weights)
        model.compile(
            optimizer=keras.optimizers.Adam(args.learning_rate),
            loss=keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, ignore_class=0
            ),
        )
        start = time.perf_counter()
        model.fit(
            x,
            y,
            batch_size=args.batch_size,
            epochs=1,
            shuffle=False,
            callbacks=[record],
            verbose=0,
        )
        seconds = time.perf_counter() - start
    return model, np.array(losses, "float64"), model.get_weights(), seconds


def layouts(model):
    """`{path: sharding}` of the variables the LayoutMap shards."""
    out = {}
    for variable in model.weights:
        sharding = getattr(variable.value, "sharding", None)
        spec = getattr(sharding, "spec", None)
        if spec is not None and any(axis is not None for axis in spec):
            out[variable.path] = str(tuple(spec))
    return out


def main(argv=None):
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
        import torch  # noqa: F401  (before tensorflow, see the tests)
    import keras
    import numpy as np

    supported = keras.backend.backend() == "jax"
    devices = keras.distribution.list_devices() if supported else []
    print(
        f"keras_attention distributed training on {keras.backend.backend()}"
        f" (Keras {keras.__version__})"
    )
    summary = {
        "backend": keras.backend.backend(),
        "distribution_supported": supported,
        "devices": len(devices),
        "models": {},
    }
    if supported:
        print(f"{len(devices)} devices: {', '.join(devices)}")
        if len(devices) < 2:
            print(
                "only one device: the distributed runs equal the baseline "
                "(use --simulate-devices 8 on a CPU)"
            )
    else:
        print(
            f"The Keras distribution API (keras.distribution) is not "
            f"implemented for the {keras.backend.backend()} backend in Keras "
            f"{keras.__version__} (JAX only; TensorFlow has an unfinished "
            "DTensor prototype that lays out nothing, PyTorch none). "
            "Training the single-device baseline only."
        )
    if args.simulate_devices and keras.backend.backend() != "jax":
        print("--simulate-devices applies to JAX only; ignored")
    shards = args.model_shards
    if supported and len(devices) % shards:
        shards = 1
    tasks = {"gpt": gpt_task, "nmt": nmt_task}
    ok = True
    for name in args.models.split(","):
        build, x, y = tasks[name](args)
        keras.utils.set_random_seed(args.seed)
        initial = build().get_weights()
        runs = {}
        _, base_losses, base_weights, seconds = train(
            build, x, y, initial, args
        )
        runs["single device"] = {"seconds": round(seconds, 2)}
        print(
            f"\n{name}: {args.steps} steps of {args.batch_size} examples; "
            f"single device: loss {base_losses[0]:.4f} -> "
            f"{base_losses[-1]:.4f} ({seconds:.1f} s)"
        )
        if supported:
            mesh = keras.distribution.DeviceMesh(
                (len(devices) // shards, shards), ("batch", "model"), devices
            )
            layout_map = keras.distribution.LayoutMap(mesh)
            for pattern, layout in LAYOUTS.items():
                layout_map[pattern] = layout
            distributions = {
                "data parallel": keras.distribution.DataParallel(
                    devices=devices
                ),
                "model parallel": keras.distribution.ModelParallel(
                    layout_map=layout_map, batch_dim_name="batch"
                ),
            }
            for label, distribution in distributions.items():
                model, losses, weights, seconds = train(
                    build, x, y, initial, args, distribution
                )
                loss_difference = float(np.max(np.abs(losses - base_losses)))
                weight_difference = max(
                    float(np.max(np.abs(a - b)))
                    for a, b in zip(weights, base_weights, strict=True)
                )
                sharded = layouts(model)
                runs[label] = {
                    "seconds": round(seconds, 2),
                    "max_loss_difference": loss_difference,
                    "max_weight_difference": weight_difference,
                    "sharded_variables": len(sharded),
                }
                ok = ok and loss_difference <= args.tolerance
                mesh_text = (
                    f"mesh {len(devices)} devices"
                    if label == "data parallel"
                    else f"mesh (batch {len(devices) // shards}, model "
                    f"{shards})"
                )
                print(
                    f"  {label:14s} ({mesh_text}): loss {losses[0]:.4f} -> "
                    f"{losses[-1]:.4f} ({seconds:.1f} s); max |loss - "
                    f"single device| = {loss_difference:.2e}, max |weight "
                    f"difference| = {weight_difference:.2e}, "
                    f"{len(sharded)} variables sharded"
                )
                for path, spec in list(sharded.items())[:4]:
                    print(f"      {path}: {spec}")
        summary["models"][name] = {
            "steps": args.steps,
            "batch_size": args.batch_size,
            "baseline_losses": [float(v) for v in base_losses],
            "runs": runs,
        }
    summary["losses_match"] = ok
    output = Path(args.output) / "distributed"
    output.mkdir(parents=True, exist_ok=True)
    (output / "results.json").write_text(json.dumps(summary, indent=2))
    print("RESULT " + json.dumps(summary))
    return summary


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(0 if main()["losses_match"] else 1)
