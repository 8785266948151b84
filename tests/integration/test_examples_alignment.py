"""The alignment study runs end to end (tiny `--smoke` sizes)."""

import json

import keras
import pytest

from tests.integration.test_examples import run_example

MECHANISMS = ("bahdanau", "luong-general", "location-sensitive", "monotonic")
RATES = ("exact", "alignment_error", "alignment_error_initial")


@pytest.mark.slow
def test_alignment_study_smoke(tmp_path):
    out = run_example(
        "alignment_study.py", "--smoke", "--output", str(tmp_path)
    )
    assert f"on {keras.backend.backend()}" in out
    for mechanism in MECHANISMS:
        assert f"\n{mechanism} (trained in" in out
        heatmap = tmp_path / f"alignment_study_{mechanism}.png"
        assert heatmap.read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "alignment_study.png").read_bytes()[:4] == b"\x89PNG"
    table = json.loads((tmp_path / "results.json").read_text())
    assert list(table) == list(MECHANISMS)
    for rows in table.values():
        assert [row["length"] for row in rows] == [1, 2, 4]
        for row in rows:
            assert set(row) == {"length", "count", *RATES}
            assert row["count"] > 0
            assert all(0.0 <= row[rate] <= 1.0 for rate in RATES)
