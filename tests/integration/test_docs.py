"""Every Python code block of the README and the docs runs."""

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs early: see tests/conftest.py

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def code_blocks():
    for page in PAGES:
        for number, match in enumerate(BLOCK.finditer(page.read_text()), 1):
            yield pytest.param(
                match.group(1), id=f"{page.relative_to(ROOT)}#{number}"
            )


def test_pages_have_code():
    assert len(list(code_blocks())) >= 2


@pytest.mark.parametrize("source", code_blocks())
def test_code_block_runs(source, capsys):
    exec(compile(source, "<docs>", "exec"), {"__name__": "__docs__"})
    printed = capsys.readouterr().out
    for line in source.splitlines():
        # `print(...)  # expected` lines state their output; check it.
        if line.startswith("print(") and "#" in line:
            assert line.split("#", 1)[1].strip() in printed
