"""Every Python code block of the README and the docs runs.

A block preceded by `<!-- docs-test: backends=tensorflow,jax -->` runs
on those backends only: the page says in its text what differs on the
others (PyTorch exports fixed shapes only, for instance). The blocks of
a page marked `<!-- docs-test: blocks share one namespace -->` (a
tutorial) run in order in one namespace, as one test.
"""

import re
from pathlib import Path

import keras
import pytest

pytestmark = pytest.mark.slow  # runs early: see tests/conftest.py

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(
    r"^(?:<!-- docs-test: backends=([\w,]+) -->\n)?```python\n(.*?)^```",
    re.S | re.M,
)


SHARED = "<!-- docs-test: blocks share one namespace -->"


def code_blocks():
    for page in PAGES:
        text = page.read_text()
        blocks = []
        for number, match in enumerate(BLOCK.finditer(text), 1):
            backends = match.group(1)
            skip = backends and keras.backend.backend() not in backends
            blocks.append(
                pytest.param(
                    [match.group(2)],
                    id=f"{page.relative_to(ROOT)}#{number}",
                    marks=pytest.mark.skip(f"runs on {backends}")
                    if skip
                    else (),
                )
            )
        if SHARED in text:
            sources = [source for p in blocks for source in p.values[0]]
            yield pytest.param(sources, id=f"{page.relative_to(ROOT)}")
        else:
            yield from blocks


def test_pages_have_code():
    assert len(list(code_blocks())) >= 2


# Warnings from the exporters' own code, not from the pages' code:
# tf2onnx reads `np.object`.
@pytest.mark.filterwarnings("ignore:In the future `np.object`:FutureWarning")
@pytest.mark.parametrize("sources", code_blocks())
def test_code_block_runs(sources, capsys):
    namespace = {"__name__": "__docs__"}
    for source in sources:
        exec(compile(source, "<docs>", "exec"), namespace)
        printed = capsys.readouterr().out
        for line in source.splitlines():
            # `print(...)  # expected` lines state their output; check it.
            if line.startswith("print(") and "#" in line:
                assert line.split("#", 1)[1].strip() in printed
