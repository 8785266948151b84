"""Every measured figure the README and the docs quote comes from the
results they cite. No benchmark runs here: the JSON results are read.

* `docs/performance.md` is what `benchmarks/report.py` writes from
  `benchmarks/results/*.json` (regenerated here, without its plot).
* The page's hand-written summary (`benchmarks/performance_intro.md`,
  from "At a glance" on) and the quantization figures of the deployment
  guide quote only numbers that stand in the generated tables, at the
  precision quoted: a ratio `Nx` (or its inverse: "0.37x the bytes" is a
  2.72x ratio), a percentage, a size in GiB (a MiB cell / 1024).
* The README quotes no measured figure: it links to the pages.
"""

import importlib.util
import re
from pathlib import Path

import keras
import pytest

# Independent of the backend: checked once, in the JAX pass.
pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "jax",
    reason="backend-independent; runs in the JAX pass only",
)

ROOT = Path(__file__).resolve().parents[2]
# 1.26x, 2.2-2.5x, 65-73%, 2.3 GiB, ~19 GiB
FIGURE = re.compile(
    r"(?<![\w.])(\d+(?:\.\d+)?)(?:-(\d+(?:\.\d+)?))?(x|%| GiB)(?!\w)"
)
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def report():
    spec = importlib.util.spec_from_file_location(
        "report", ROOT / "benchmarks" / "report.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generated():
    """The performance page, and its part written from the results."""
    module = report()
    page = module.render(plot=False)
    return page, page[len(module.INTRO.rstrip()) :]


def figures(text):
    """`(quoted, number, unit)` of every figure in `text` outside code."""
    for match in FIGURE.finditer(CODE.sub("", text)):
        low, high, unit = match.groups()
        for number in (low, high):
            if number is not None:
                yield match.group(0), number, unit


def candidates(tables):
    """The values of the tables' cells, by unit, with inverses of ratios
    and MiB cells (peak memory) in GiB."""
    values = {"x": set(), "%": set(), " GiB": set()}
    for _, number, unit in figures(tables):
        values[unit].add(float(number))
    values["x"] |= {1 / v for v in values["x"] if v}
    for row in re.findall(r"^\|.*\|$", tables, re.M):
        for cell in re.findall(r"(?<=\| )(\d+(?:\.\d+)?)(?= \|)", row):
            values[" GiB"].add(float(cell) / 1024)  # MiB columns
    return values


def unsupported(text, values):
    """The figures of `text` that no value rounds to."""
    missing = []
    for quoted, number, unit in figures(text):
        places = len(number.partition(".")[2])
        if not any(
            round(v + 1e-12, places) == float(number) for v in values[unit]
        ):
            missing.append(quoted)
    return missing


def test_performance_page_is_generated_from_the_results(generated):
    page, _ = generated
    written = (ROOT / "docs" / "performance.md").read_text()
    assert written == page, "run `python benchmarks/report.py`"


def test_performance_summary_quotes_the_tables(generated):
    _, tables = generated
    intro = (ROOT / "benchmarks" / "performance_intro.md").read_text()
    summary = intro[intro.index("## At a glance") :]
    assert len(list(figures(summary))) > 40
    assert unsupported(summary, candidates(tables)) == []


def test_quantization_guide_quotes_the_tables(generated):
    _, tables = generated
    section = tables[tables.index("## int8 quantization") :]
    guide = ROOT / "docs" / "guides" / "deploying-and-converting.md"
    text = guide.read_text()
    quoted = text[text.index("What it buys") : text.index('`"float8"`')]
    assert len(list(figures(quoted))) >= 5
    assert unsupported(quoted, candidates(section)) == []


def test_readme_quotes_no_measured_figure():
    readme = (ROOT / "README.md").read_text()
    assert list(figures(readme)) == []
    assert "performance/" in readme and "examples/" in readme


def test_the_check_catches_a_figure_not_in_the_tables():
    tables = "| a | 1.26x | 0.16x | 42% | 2317 |\n"
    values = candidates(tables)
    text = "1.3x, 1.26x, 6.3x, 6.25x, 42%, 2.3 GiB, 1.3-2.2x and 0.14x"
    assert unsupported(text, values) == ["1.3-2.2x", "0.14x"]
