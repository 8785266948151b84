"""Test setup shared by the whole suite.

The suite runs once per backend, each in its own process: `KERAS_BACKEND`
is read when keras is first imported, so it is never changed here.
"""

import gc
import importlib.metadata
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# No persistent JAX compilation cache: serialising an XLA:CPU executable
# for it crashed an xdist worker (a segfault inside `executable.serialize()`
# under jaxlib 0.10.2), and the run then hung. Set JAX_COMPILATION_CACHE_DIR
# yourself to use one locally.

# Compiling, not running, is what the suite spends its time on under XLA
# (all of JAX, TensorFlow's `jit_compile=True` functions): every eager op of
# a new shape is a program of its own (~50 ms each on XLA:CPU), and the
# arrays are tiny. These flags lower only how hard the CPU backend
# optimises the machine code it emits (LLVM's level and XLA's newer fusion
# emitters); the HLO passes, and so what is computed, are unchanged.
# Compiling takes half as long. Subprocesses inherit them.
_FAST_COMPILE = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
    "--xla_cpu_use_fusion_emitters=false",
)


def _jaxlib_version():
    try:
        release = importlib.metadata.version("jaxlib").split(".")[:2]
        return tuple(int(part) for part in release)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


# An unknown flag in XLA_FLAGS aborts the process, and jaxlib 0.11 no longer
# knows this one (the GPU machine of `make gpu-check` has jaxlib 0.11.2).
if (_jaxlib_version() or (0, 0)) >= (0, 11):
    _FAST_COMPILE = _FAST_COMPILE[:2]
_XLA_FLAGS = os.environ.get("XLA_FLAGS", "").split()
os.environ["XLA_FLAGS"] = " ".join(  # xdist workers inherit them already
    _XLA_FLAGS + [flag for flag in _FAST_COMPILE if flag not in _XLA_FLAGS]
)

if os.environ.get("KERAS_BACKEND") == "torch":
    # Importing tensorflow before torch in one process can crash torch;
    # Keras's own test setup imports torch first for the same reason.
    import torch

    # One thread per xdist worker (each has its own core; the ops are tiny).
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)

import keras  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck  # noqa: E402
from hypothesis import settings  # noqa: E402

BACKEND = keras.backend.backend()

if BACKEND == "tensorflow":
    import tensorflow as tf

    # Each xdist worker has a core to itself, and every op of the suite is
    # tiny: TensorFlow's thread pools only add hand-offs. Grappler rewrites
    # every traced graph for speed before its first run (the suite runs
    # most graphs once); what a graph computes does not depend on it.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.optimizer.set_experimental_options(
        {"disable_meta_optimizer": True}
    )

# Property tests: `ci` (the default) is derandomised and keeps no example
# database, so every run tries the same examples; `HYPOTHESIS_PROFILE=dev`
# explores ten times more.
_PROFILE = {
    "deadline": None,
    "print_blob": True,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
settings.register_profile(
    "ci", max_examples=25, derandomize=True, database=None, **_PROFILE
)
settings.register_profile("dev", max_examples=250, **_PROFILE)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(items):
    """The files with slow tests run first.

    A file stays on one xdist worker (`--dist loadfile`), and xdist hands
    the files out in this order (`--no-loadscope-reorder`): a long file
    taken last would leave the other worker idle until it ends. First the
    long files, then the rest, the ones with most tests first."""
    per_file = {}
    for item in items:
        slow, count = per_file.get(item.path, (False, 0))
        per_file[item.path] = (
            slow or bool(item.get_closest_marker("slow")),
            count + 1,
        )
    items.sort(
        key=lambda item: (not per_file[item.path][0], -per_file[item.path][1])
    )


_TESTS_PER_COLLECTION = 50
_tests_run = 0


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """While a test runs (its fixtures included), the objects that were
    alive before it are out of the garbage collector's sight.

    A process of the suite holds millions of objects once JAX's caches and
    TensorFlow's graphs have grown, and a full collection then takes
    0.5-1.5 s. Keras runs one for every kernel `quantize` replaces (35 in
    one of our models) and `clear_session` runs one: the JAX pass spent
    70 s in them. Frozen, a collection inside a test examines only what
    the test made; `pytest_runtest_teardown` unfreezes them, so nothing is
    kept from collection for longer than one test."""
    gc.freeze()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item):
    """Before the test's fixtures are torn down (and `_fresh_keras_state`
    collects), even when its setup failed."""
    gc.unfreeze()


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Each test starts from float32, a fixed seed and a clean session.

    `clear_session` would also run a full garbage collection, which costs
    about 0.3 s a test once JAX's caches are large (a third of a file's
    time); one collection every `_TESTS_PER_COLLECTION` tests keeps the
    memory bounded at a fraction of that cost."""
    global _tests_run
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    yield
    keras.config.set_dtype_policy("float32")
    _tests_run += 1
    keras.backend.clear_session(
        free_memory=_tests_run % _TESTS_PER_COLLECTION == 0
    )


# The path-equivalence figures of every process of the run: this one's,
# and under pytest-xdist (`-n`), those each worker hands over when it ends.
_WORKER_RECORDS = []


def _path_record():
    """`{(what, dtype): (cases, forward error, gradient error)}` of this
    process (`tests.autodiff.RECORD`), or `{}`."""
    autodiff = sys.modules.get("tests.autodiff")
    return dict(autodiff.RECORD) if autodiff is not None else {}


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the figures over
        workeroutput["path_record"] = [
            [list(key), list(value)] for key, value in _path_record().items()
        ]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """An xdist worker ended: keep the figures it handed over."""
    record = getattr(node, "workeroutput", {}).get("path_record", [])
    _WORKER_RECORDS.append({tuple(key): value for key, value in record})


def pytest_terminal_summary(terminalreporter):
    """The path-equivalence figures: cases and largest errors against the
    float64 reference, per kind of case and dtype, over every process."""
    merged = {}
    for record in [_path_record(), *_WORKER_RECORDS]:
        for key, (cases, forward, grad) in record.items():
            old = merged.get(key, (0, 0.0, 0.0))
            merged[key] = (
                old[0] + cases,
                max(old[1], forward),
                max(old[2], grad),
            )
    if not merged:
        return
    terminalreporter.section(f"path equivalence ({BACKEND})")
    total = 0
    for (what, dtype), (cases, forward, grad) in sorted(merged.items()):
        total += cases
        terminalreporter.line(
            f"{what:<34} {dtype:<9} {cases:>4} cases  "
            f"forward {forward:.1e}  gradients {grad:.1e}"
        )
    terminalreporter.line(f"{total} cases in all")
