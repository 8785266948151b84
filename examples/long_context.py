"""Training the mini GPT on sequences longer than one device holds.

The mini GPT of `mini_gpt.py` (decoder-only, rotary positions,
grouped-query attention) is trained on windows of `--sequence-length`
bytes of docstrings under `keras_attention.distribution.ContextParallel`:
each batch is split along time over the devices of a `(batch, sequence)`
mesh, and every attention layer attends each device's queries to the
whole sequence, gathering the keys and values or passing them around a
ring of devices (Liu et al. 2023): here, with grouped-query heads, they
are small and gathered, which the printed `explain()` says. The causal
work is balanced by a zig-zag order of the sequence. The model code is
the one-device code.

The script reports, per device, the memory of the compiled training step
(from XLA's memory analysis) on one device and under the distribution,
then trains a few steps and prints the losses. With `--check`, it also
trains the same steps on one device and compares the losses.

On a CPU, `--devices N` simulates N devices (XLA host devices, set
before JAX starts). JAX only.

    python examples/long_context.py --devices 8 --sequence-length 16384
    python examples/long_context.py --smoke
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--batch-devices", type=int, default=1)
    parser.add_argument("--sequence-length", type=int, default=16384)
    parser.add_argument("--units", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument(
        "--check",
        action="store_true",
        help="also train on one device and compare the losses",
    )
    parser.add_argument("--smoke", action="store_true", help="seconds-long run")
    args = parser.parse_args(argv)
    if args.smoke:
        args.sequence_length, args.units, args.layers = 256, 32, 1
        args.steps, args.check = 2, True
    return args


def build(args):
    """The mini GPT of `mini_gpt.py`, with rotary positions."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import mini_gpt

    settings = argparse.Namespace(
        units=args.units,
        heads=args.heads,
        kv_heads=args.kv_heads,
        layers=args.layers,
        dropout=0.0,
        positions="rotary",
        sequence_length=args.sequence_length,
    )
    return mini_gpt.build_model(settings)


def batches(args):
    """`steps x batch` windows of `sequence_length + 1` docstring bytes."""
    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import mini_gpt

    _, _, streams, _ = mini_gpt.load_corpus(40 if args.smoke else None)
    rng = np.random.default_rng(0)
    count = args.steps * args.batch_size
    return mini_gpt.windows(streams["train"], count, args.sequence_length, rng)


def compiled_model(args):
    import keras

    keras.utils.set_random_seed(0)
    model = build(args)
    model.compile(
        optimizer=keras.optimizers.Adam(args.learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def step_memory(model, args):
    """Per device, the bytes of the compiled training step (loss and
    gradients of every weight): `(temporaries, inputs and outputs)`."""
    import jax
    import keras

    tokens = jax.ShapeDtypeStruct(
        (args.batch_size, args.sequence_length), "int32"
    )
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    fixed = [v.value for v in model.non_trainable_variables]

    def loss(weights, x, y):
        logits, _ = model.stateless_call(weights, fixed, x)
        return loss_fn(y, logits)

    weights = [v.value for v in model.trainable_variables]
    compiled = jax.jit(jax.grad(loss)).lower(weights, tokens, tokens).compile()
    analysis = compiled.memory_analysis()
    return (
        analysis.temp_size_in_bytes,
        analysis.argument_size_in_bytes + analysis.output_size_in_bytes,
    )


def main(argv=None):
    from examples.backend import publish

    args = parse_args(argv)
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = (
        f"{flags} --xla_force_host_platform_device_count={args.devices}"
    )
    os.environ["KERAS_BACKEND"] = "jax"
    import keras

    from keras_attention.distribution import ContextParallel
    from keras_attention.functional import explain

    devices = keras.distribution.list_devices()
    if len(devices) < args.devices:
        sys.exit(f"{args.devices} devices asked, {len(devices)} found")
    sequence_devices = args.devices // args.batch_devices
    mesh = keras.distribution.DeviceMesh(
        (args.batch_devices, sequence_devices),
        ("batch", "sequence"),
        devices[: args.devices],
    )
    distribution = ContextParallel(mesh)
    x, y = batches(args)

    def fitted():
        model = compiled_model(args)
        losses = []
        callback = keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda batch, logs: losses.append(
                float(logs["loss"])
            )
        )
        start = time.perf_counter()
        model.fit(
            x, y, batch_size=args.batch_size, epochs=1, shuffle=False,
            verbose=0, callbacks=[callback],
        )  # fmt: skip
        return model, losses, time.perf_counter() - start

    one_device = step_memory(compiled_model(args), args)
    with distribution.scope():
        shared = step_memory(compiled_model(args), args)
        model, losses, seconds = fitted()
        explanation = explain(
            keras.KerasTensor((args.batch_size, args.sequence_length,
                               args.heads, args.units // args.heads)),
            keras.KerasTensor((args.batch_size, args.sequence_length,
                               args.kv_heads, args.units // args.heads)),
            is_causal=True,
        )  # fmt: skip
    summary = {
        "devices": args.devices,
        "mesh": [args.batch_devices, sequence_devices],
        "sequence_length": args.sequence_length,
        "one_device_step_bytes": one_device,
        "per_device_step_bytes": shared,
        "memory_ratio": round(sum(shared) / sum(one_device), 3),
        "losses": [round(v, 4) for v in losses],
        "train_seconds": round(seconds, 1),
    }
    print(f"attention in each block:\n{explanation}")
    print(
        f"training step per device: {sum(shared) / 2**20:.1f} MiB under "
        f"ContextParallel on {args.devices} devices, "
        f"{sum(one_device) / 2**20:.1f} MiB on one device"
    )
    for step, loss in enumerate(losses, 1):
        print(f"step {step}: loss {loss:.4f}")
    if args.check:
        _, alone, _ = fitted()
        difference = max(abs(a - b) for a, b in zip(alone, losses, strict=True))
        summary["one_device_losses"] = [round(v, 4) for v in alone]
        summary["loss_difference"] = difference
        print(f"largest loss difference from one device: {difference:.2e}")
        if difference > 1e-4:
            print(json.dumps(summary))
            sys.exit(1)
    print(json.dumps(summary))
    publish("long-context", summary, args)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
