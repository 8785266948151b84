"""`ContextParallel`: attention with the sequence sharded over 8 simulated
CPU devices equals the one-device computation, in outputs and in the
gradients of every input and trainable weight.

The device count is fixed when JAX starts, so `cp_worker` runs the
checks of each mesh in a subprocess and the tests read its JSON.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

from keras_attention.distribution import ContextParallel
from tests.helpers import BACKEND

ROOT = Path(__file__).resolve().parents[3]
TOLERANCE = 1e-5
MESHES = [(1, 8), (2, 4)]
jax_only = pytest.mark.skipif(
    BACKEND != "jax", reason="ContextParallel is JAX's"
)


@pytest.fixture(scope="module")
def results():
    """The worker's findings for each mesh: `{(batch, sequence): {...}}`."""
    env = dict(os.environ, KERAS_BACKEND="jax")
    env["XLA_FLAGS"] = " ".join(
        [env.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8"]
    )
    found = {}
    for batch, sequence in MESHES:
        run = subprocess.run(
            [sys.executable, "-m", "tests.unit.distribution.cp_worker",
             str(batch), str(sequence)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        found[batch, sequence] = json.loads(run.stdout.strip().splitlines()[-1])
    return found


def assert_matches(differences):
    """Every case within `TOLERANCE` of one device, and every case ran
    the context-parallel path (at least one call traced under it)."""
    assert differences
    for case, (difference, calls) in differences.items():
        assert calls >= 1, f"{case}: the context-parallel path did not run"
        assert difference <= TOLERANCE, f"{case}: {difference}"


@jax_only
@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_functional_matches_one_device(results, mesh):
    functional = results[mesh]["functional"]
    assert_matches(functional)
    structures = {case.split("/")[1] for case in functional}
    assert {"plain", "causal", "window", "segments", "padding", "alibi"} <= (
        structures
    )


@jax_only
def test_mods_of_per_row_data_with_several_rows_per_device(results):
    """`prefix_lm` and `document` on a batch split in blocks of two rows
    (each device calls them on its rows by their global indices)."""
    assert set(results[2, 4]["rows"]) == {"prefix_lm", "document"}
    assert_matches(results[2, 4]["rows"])


@jax_only
def test_both_exchanges_and_the_nested_blocks_are_checked(results):
    exchanges = {
        case.split("/")[0]
        for mesh in MESHES
        for case in results[mesh]["functional"]
    }
    assert exchanges == {"all_gather", "ring"}


@jax_only
@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_layers_match_one_device(results, mesh):
    layers = results[mesh]["layers"]
    assert_matches(layers)
    assert {case.split("/")[0] for case in layers} == {
        "mhsa",
        "encoder",
        "decoder",
        "cross",
    }


@jax_only
def test_fit_gives_the_one_device_losses_and_weights(results):
    difference, calls, unmoved = results[2, 4]["fit"]
    assert_matches({"fit": [difference, calls]})
    assert unmoved == 0, "every trainable weight moves under the distribution"


@jax_only
def test_a_third_mesh_axis_carries_tensor_parallelism(results):
    assert_matches({"tensor_parallel": results[2, 4]["tensor_parallel"]})


@jax_only
def test_a_length_the_mesh_does_not_divide_is_refused(results):
    message = results[1, 8]["refusal"]
    assert message is not None
    assert "scaled_dot_product_attention" in message
    assert "multiple of 2 x 8" in message
    assert "Received: query_length=20" in message


@jax_only
def test_causal_work_is_balanced(results):
    """Visited chunk pairs per device from the plan: the zig-zag order
    within 1.2x of the mean; contiguous shards are not (the last device
    would do ten times the first one's work)."""
    balance = results[1, 8]["balance"]
    zigzag, contiguous = (
        np.array(balance[f"causal/{k}"]) for k in ("zigzag", "contiguous")
    )
    assert zigzag.max() <= 1.2 * zigzag.mean()
    assert zigzag.sum() == contiguous.sum()  # the same pairs, redistributed
    assert contiguous.max() > 1.2 * contiguous.mean()
    assert balance["causal/chosen"] == balance["causal/zigzag"]


@jax_only
def test_the_layout_takes_the_better_balanced_order(results):
    """For a causal window of T/2 the order is chosen from the plan: its
    busiest device visits no more chunk pairs, over the mean, than the
    other order's."""
    balance = results[1, 8]["balance"]
    chosen, other = (
        np.array(balance[f"window/{k}"]) for k in ("chosen", "other")
    )
    assert chosen.max() / chosen.mean() <= other.max() / other.mean()


@jax_only
def test_memory_per_device_falls_with_the_devices(results):
    """From the compiled training step's memory analysis (T = 65536):
    the inputs and outputs per device halve with each doubling of the
    devices (to a few bytes of scalars); from 2 devices on, the whole
    step does nearly so (the ring's buffers in flight appear at 2), and
    8 devices hold under a quarter of what one does."""
    memory = {int(p): figures for p, figures in results[1, 8]["memory"].items()}
    total = {p: sum(figures) for p, figures in memory.items()}
    for devices in (2, 4, 8):
        arguments, previous = memory[devices][1], memory[devices // 2][1]
        assert arguments * 2 == pytest.approx(previous, rel=1e-6)
    for devices in (4, 8):
        assert total[devices] <= 0.6 * total[devices // 2], total
    assert total[8] <= 0.25 * total[1], total


@pytest.mark.skipif(BACKEND == "jax", reason="refused on the other backends")
def test_other_backends_are_refused_clearly():
    with pytest.raises(ValueError, match="ContextParallel: needs the JAX"):
        ContextParallel(None)


@jax_only
def test_bad_arguments_are_refused_clearly():
    mesh = keras.distribution.DeviceMesh(
        (1, 1), ("batch", "sequence"), keras.distribution.list_devices()[:1]
    )
    with pytest.raises(ValueError, match="`sequence_dim_name` must name"):
        ContextParallel(mesh, sequence_dim_name="time")
    with pytest.raises(ValueError, match="`device_mesh` must be"):
        ContextParallel("mesh")
    with pytest.raises(ValueError, match="must differ"):
        ContextParallel(mesh, batch_dim_name="batch", sequence_dim_name="batch")
    layout = ContextParallel(mesh).get_data_layout((4, 16, 8))
    assert tuple(layout.axes) == ("batch", "sequence", None)
    # A layout map on an equal mesh (another object) is on this mesh.
    twin = keras.distribution.DeviceMesh(
        (1, 1), ("batch", "sequence"), keras.distribution.list_devices()[:1]
    )
    ContextParallel(mesh, layout_map=keras.distribution.LayoutMap(twin))
    other = keras.distribution.DeviceMesh(
        (1, 1), ("data", "sequence"), keras.distribution.list_devices()[:1]
    )
    with pytest.raises(ValueError, match="Received: layout_map on"):
        ContextParallel(mesh, layout_map=keras.distribution.LayoutMap(other))


@jax_only
def test_published_tables_are_the_results():
    """The guide's and the Performance page's context-parallel tables are
    what `benchmarks/report.py` renders from the results."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "report", ROOT / "benchmarks" / "report.py"
    )
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    tables = "\n".join(report.context_parallel_tables()) + "\n"
    assert report.SNIPPET.read_text() == tables
    guide = (ROOT / "docs" / "guides" / "long-sequences.md").read_text()
    assert f'--8<-- "{report.SNIPPET.relative_to(ROOT)}"' in guide
    assert tables.strip() in (ROOT / "docs" / "performance.md").read_text()
