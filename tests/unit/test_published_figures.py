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
* The examples' pages (`docs/examples/index.md`, `examples/README.md`,
  and the alignment study on the monotonic attention page) quote only
  numbers recorded by the scripts' full runs in `examples/results/`.
"""

import importlib.util
import json
import math
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


# The examples' pages: every measured number comes from a full run's
# record in examples/results/ (written by the scripts themselves).
EXAMPLE_PAGES = (
    "docs/examples/index.md",
    "examples/README.md",
    "docs/concepts/monotonic-attention.md",  # the alignment study
)
# 99.5%, 6.4x, 94 s, 3.1 min, 314 ms, 108 tokens/s, 4.55, 4.8e-07, 6,948
NUMBER = re.compile(
    r"(?<![\w.,/-])(\d{1,3}(?:,\d{3})+|\d+\.\d+e[-+]\d+|\d+(?:\.\d+)?)"
    r"(?:-(\d+(?:\.\d+)?))?"
    r"((?:x| ?(?:%|s|min|ms|tokens/s|KB|MB|MiB))(?!\w))?"
    r"(?!\w|\.\d)"
)
LINK = re.compile(r"\]\([^)]*\)|!\[[^\]]*\]")


def measured(text):
    """`(quoted, number)` of every figure in `text` outside code and link
    targets that is a measurement: a number with a decimal point, an
    exponent, thousands separators or a unit. Small bare integers (2
    blocks, 8 digits, years of papers) are settings or names."""
    text = LINK.sub("]", CODE.sub("", text))
    for match in NUMBER.finditer(text):
        low, high, unit = match.groups()
        for number in (low, high):
            if number is None:
                continue
            if unit or high or re.search(r"[.,e]", number):
                yield match.group(0), number.replace(",", "")


def leaves(tree):
    if isinstance(tree, dict):
        tree = list(tree.values())
    if isinstance(tree, list):
        for item in tree:
            yield from leaves(item)
        if tree and all(isinstance(v, (int, float)) for v in tree):
            yield float(sum(tree))  # a total: the bytes of a step's buffers
    elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
        yield float(tree)
    elif isinstance(tree, str) and re.fullmatch(r"\d+-\d+", tree):
        yield from map(float, tree.split("-"))  # a bucket, "18-46"


def example_values():
    """Every number of every record, as recorded and as the pages may
    quote it: a fraction as a percentage, seconds in minutes and
    milliseconds, bytes in KB, MB and MiB, a list by its total; and, for
    a figure in `x` only, the ratio of two numbers of the same record (a
    speed-up)."""
    values = {"": set(), "x": set()}
    for path in sorted((ROOT / "examples" / "results").glob("*.json")):
        numbers = set(leaves(json.loads(path.read_text())))
        for v in numbers:
            values[""] |= {v, 100 * v, v / 60, 1000 * v, v / 1e3, v / 1e6}
            values[""].add(v / 2**20)  # bytes in MiB
        values["x"] |= {a / b for a in numbers for b in numbers if b}
    values["x"] |= values[""]
    return values


def unsupported_examples(text, values):
    missing = []
    for quoted, number in measured(text):
        candidates = values["x" if quoted.endswith("x") else ""]
        mantissa = number.split("e")[0]
        places = len(mantissa.partition(".")[2])
        target = float(number)
        if "e" in number:  # 4.8e-07: the same significant digits
            scale = 10.0 ** math.floor(math.log10(abs(target)))
            hit = any(
                v and round(v / scale, places) == round(target / scale, places)
                for v in candidates
            )
        else:
            hit = any(round(v + 1e-12, places) == target for v in candidates)
        if not hit:
            missing.append(quoted)
    return missing


@pytest.mark.parametrize("page", EXAMPLE_PAGES)
def test_example_pages_quote_the_recorded_runs(page):
    text = (ROOT / page).read_text()
    assert len(list(measured(text))) > 20
    assert unsupported_examples(text, example_values()) == []


def test_the_example_check_catches_a_figure_not_recorded():
    plain = {0.995, 94.2, 4.5512, 4.83e-07, 6948.0, 314.4 / 1000, 2.0}
    plain |= {100 * v for v in plain} | {1000 * v for v in plain}
    values = {"": plain, "x": plain | {4.5512 / 2.0}}
    text = (
        "2.3x (2.28 as a plain number), "
        "99.5% in 94 s, perplexity 4.55 (4.56), 4.8e-07 (4.9e-07), 6,948 "
        "documents (6,949), 314 ms, Keras 3.15.1, 2 blocks, `12.5 min`, "
        "[page](results/7.5.md), 32 x 128 bytes, a tolerance of 1e-5 "
        "and 1.3-2.2x"
    )
    assert unsupported_examples(text, values) == [
        "2.28",
        "4.56",
        "4.9e-07",
        "6,949",
        "1.3-2.2x",
        "1.3-2.2x",
    ]
