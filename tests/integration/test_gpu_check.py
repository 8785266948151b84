"""`benchmarks/gpu_check.py --dry-run`: the GPU check, run on the CPU.

A GPU is lent now and then for minutes, and the check must then work at
the first call. Its dry run goes the same way (the same script, the same
selection of tests narrowed to a few cases, `gpu.py` at tiny sizes) for
this pass's backend, in a process of its own; it must write the files
the GPU run writes, with the fields the summary and the Performance page
read. TensorFlow is not part of the GPU check.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import keras
import pytest

ROOT = Path(__file__).resolve().parents[2]
BACKEND = keras.backend.backend()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        BACKEND == "tensorflow", reason="the GPU check runs JAX and PyTorch"
    ),
]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    command = [sys.executable, "benchmarks/gpu_check.py", "--dry-run"]
    command += ["--backends", BACKEND, "--out", str(out)]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    return out, done


def test_the_dry_run_passes_and_writes_what_comes_back(dry_run):
    out, done = dry_run
    summary = json.loads((out / "summary.json").read_text())
    assert done.returncode == 0, (summary["failed_parts"], done.stdout)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    assert files == sorted(
        [
            "summary.json",
            "summary.md",
            f"tests_{BACKEND}.log",
            f"bench_{BACKEND}.log",
            f"gpu_{BACKEND}.json",
        ]
    )
    # What the device tool brings back: 8 files, names of these letters.
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in files)
    assert summary["environment"]["keras_backend"] == BACKEND
    assert "# GPU check, dry run" in (out / "summary.md").read_text()


def test_the_selected_gpu_tests_ran_and_passed(dry_run):
    out, _ = dry_run
    tests = json.loads((out / "summary.json").read_text())["parts"]
    tests = tests[f"tests {BACKEND}"]
    assert tests["ok"] and not tests["timed_out"]
    assert tests["failed"] == tests["errors"] == 0, tests["failures"]
    assert tests["passed"] >= 2
    # The whole selection was collected, the dry run's -k kept a few.
    assert tests["deselected"] > 150


def test_the_benchmark_wrote_every_kind_of_row(dry_run):
    out, _ = dry_run
    bench = json.loads((out / f"gpu_{BACKEND}.json").read_text())
    assert bench["backend"] == BACKEND and bench["quick"]
    assert not bench["failed"] and not bench["skipped"]
    rows = {row["kind"]: row for row in bench["rows"]}
    assert sorted(rows) == ["attention", "generation", "layer", "mods"]
    attention = rows["attention"]
    for name in ("ours", "raw"):
        for part in ("fwd", "fwdbwd"):
            assert attention[f"{name}_{part}_tflops"] > 0
            assert attention[f"{name}_{part}_kernels"]
    assert attention["path"] in ("reference", "chunked", "fused")
    assert rows["layer"]["step_ms"] > 0
    assert rows["generation"]["tokens_per_s"] > 0
    patterns = [
        row["pattern"] for row in bench["rows"] if row["kind"] == "mods"
    ]
    assert patterns == ["document", "chunked", "prefix_lm"]
    mods = rows["mods"]
    assert mods["mod_fwdbwd_ms"] > 0 and mods["mod_over_dense"] > 0
    if BACKEND == "torch":  # no backward pass on a CPU: measured on a GPU
        assert mods["flex"].startswith("not run")
    summary = (out / "summary.md").read_text()
    assert "| mask mod: pattern |" in summary
