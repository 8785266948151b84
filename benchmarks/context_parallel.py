"""Context-parallel attention on 8 simulated CPU devices (JAX): memory per
device and the balance of causal work.

* Per-device bytes of a compiled training step (forward and backward) of
  causal attention alone, from XLA's memory analysis, on P = 1, 2, 4, 8
  devices of a `(1, P)` mesh, ring exchange: B=1, T=65536, 4 heads of 32,
  float32.
* The same for the mini GPT of `examples/mini_gpt.py` (2 blocks of 128
  units, 4 query heads, 2 key/value heads, rotary), T=16384, one device
  against 8.
* The chunk pairs each of 8 devices visits for causal attention, from
  the plan, with the zig-zag order and with contiguous shards.

Memory analysis compiles; nothing is timed, so the figures do not depend
on the machine's load. Other backends: nothing to measure (the
distribution is JAX's).

    KERAS_BACKEND=jax python context_parallel.py [--quick]

`--quick` compiles at an eighth of those lengths.
"""

import argparse
import os
import sys
from pathlib import Path

DEVICES = 8
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + f" --xla_force_host_platform_device_count={DEVICES}"
)

import keras  # noqa: E402

if keras.backend.backend() != "jax":
    print("context_parallel.py: ContextParallel is JAX's; nothing to measure")
    sys.exit(0)

import jax  # noqa: E402
from common import write  # noqa: E402

from keras_attention import functional  # noqa: E402
from keras_attention._core import Structure  # noqa: E402
from keras_attention._kernels import context  # noqa: E402
from keras_attention.distribution import ContextParallel  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import long_context  # noqa: E402

ATTENTION = {"batch": 1, "length": 65536, "heads": 4, "head_dim": 32}
MODEL = {"sequence_length": 16384, "units": 128, "layers": 2, "heads": 4,
         "kv_heads": 2}  # fmt: skip


def distribution(devices):
    mesh = keras.distribution.DeviceMesh(
        (1, devices),
        ("batch", "sequence"),
        keras.distribution.list_devices()[:devices],
    )
    return ContextParallel(mesh)


def bytes_of(compiled):
    analysis = compiled.memory_analysis()
    return {
        "temporaries": analysis.temp_size_in_bytes,
        "inputs_outputs": analysis.argument_size_in_bytes
        + analysis.output_size_in_bytes,
    }


def attention_memory(attention):
    shape = (attention["batch"], attention["length"], attention["heads"],
             attention["head_dim"])  # fmt: skip
    query = jax.ShapeDtypeStruct(shape, "float32")

    def loss(q, k, v):
        out = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return jax.numpy.sum(out * out)

    layouts = context.sharding
    default, layouts.ALL_GATHER_MAX_BYTES = layouts.ALL_GATHER_MAX_BYTES, 0
    rows = []  # the ring, at every P
    for devices in (1, 2, 4, 8):
        with distribution(devices).scope():
            step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
            figures = bytes_of(step.lower(query, query, query).compile())
        rows.append({"devices": devices, **figures})
    layouts.ALL_GATHER_MAX_BYTES = default
    return rows


def model_memory(model):
    args = long_context.parse_args(
        [f"--{k.replace('_', '-')}={v}" for k, v in model.items()]
    )
    one = long_context.step_memory(long_context.compiled_model(args), args)
    with distribution(DEVICES).scope():
        shared = long_context.step_memory(
            long_context.compiled_model(args), args
        )
    return {
        "one_device": dict(
            zip(("temporaries", "inputs_outputs"), one, strict=True)
        ),
        "per_device": dict(
            zip(("temporaries", "inputs_outputs"), shared, strict=True)
        ),
    }


def balance(length=8192):
    structure = Structure.from_args(
        where="balance", query_length=length, key_length=length,
        is_causal=True,
    )  # fmt: skip
    mesh = distribution(DEVICES).device_mesh.backend_mesh
    counts = {}
    for order, zigzag in (("zigzag", True), ("contiguous", False)):
        sharding = context.Sharding(mesh, "batch", "sequence", zigzag, True)
        visited = context.visited_chunks(sharding, structure, length, length)
        counts[order] = visited.tolist()
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    attention, model = dict(ATTENTION), dict(MODEL)
    if args.quick:
        attention["length"] //= 8
        model["sequence_length"] //= 8
    write(
        "context_parallel",
        {
            "attention": attention,
            "attention_memory": attention_memory(attention),
            "model": model,
            "model_memory": model_memory(model),
            "balance_devices": DEVICES,
            "balance": balance(),
        },
    )


if __name__ == "__main__":
    main()
