"""The example scripts run end to end (tiny `--smoke` sizes)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_example(name, *args):
    env = {**os.environ, "KERAS_BACKEND": keras.backend.backend()}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_associative_recall_smoke():
    out = run_example("associative_recall.py", "--smoke")
    assert f"on {keras.backend.backend()}" in out
    for name in ("Bahdanau", "Luong dot", "Luong general", "Luong concat"):
        assert name in out
    assert out.count("attends to the queried key") == 5


@pytest.mark.slow
def test_nmt_example_smoke(tmp_path):
    out = run_example(
        "nmt_rnn_attention.py", "--smoke", "--output", str(tmp_path)
    )
    assert "exact match" in out and "BLEU" in out and "chrF" in out
    assert "(identical to the trained model)" in out
    plots = sorted(tmp_path.glob("dates-bahdanau/alignment_*.png"))
    assert len(plots) == 3
    assert (tmp_path / "dates-bahdanau" / "model.keras").stat().st_size > 0


@pytest.mark.slow
def test_bottleneck_study_smoke(tmp_path):
    out = run_example(
        "bottleneck_study.py", "--smoke", "--output", str(tmp_path)
    )
    for variant in ("none:", "bahdanau:", "luong-general:", "transformer:"):
        assert variant in out
    assert (tmp_path / "bottleneck.png").read_bytes()[:4] == b"\x89PNG"
    import json

    table = json.loads((tmp_path / "results.json").read_text())
    assert set(table) == {"none", "bahdanau", "luong-general", "transformer"}
    assert all(
        0.0 <= row["exact"] <= 1.0 for rows in table.values() for row in rows
    )


@pytest.mark.slow
def test_packed_documents_smoke():
    """The packed-document language model: a document's predictions in a
    packed row equal its predictions alone."""
    out = run_example("packed_documents.py", "--smoke")
    assert "test perplexity per character" in out
    line = next(x for x in out.splitlines() if "packed vs alone" in x)
    assert float(line.rsplit(" ", 1)[1]) < 1e-4, line
    # The mod is built-in: it runs as `is_causal=True` with segment ids.
    structure = next(x for x in out.splitlines() if x.startswith("attention"))
    assert "band" in structure and "segment id" in structure, structure


@pytest.mark.slow
@pytest.mark.skipif(
    keras.backend.backend() != "jax", reason="ContextParallel is JAX's"
)
def test_long_context_smoke():
    """The mini GPT under ContextParallel on 8 simulated devices: the
    one-device losses, less memory per device."""
    out = run_example("long_context.py", "--smoke")
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["loss_difference"] < 1e-4
    assert summary["memory_ratio"] < 0.5
    assert "path: context_parallel" in out
