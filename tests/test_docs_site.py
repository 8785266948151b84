"""The built documentation site, rendered in headless Chromium offline.

`make test` builds the site (`mkdocs build --strict`) and installs Debian's
chromium if it is missing before running this. The pages are served from
127.0.0.1 and Chromium runs with its background networking off, so math
that typesets here typesets with no network.
"""

import functools
import html
import http.server
import re
import shutil
import subprocess
import threading
from pathlib import Path

import keras
import pytest

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "site"
SHOTS = ROOT / "build" / "docs-screenshots"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
]

# The site does not depend on the backend: check it once, in one process.
pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "jax",
    reason="backend-independent; runs in the JAX pass only",
)


@pytest.fixture(scope="module")
def server():
    assert (SITE / "index.html").exists(), "run `make docs` first"
    handler = functools.partial(
        http.server.SimpleHTTPRequestHandler, directory=str(SITE)
    )
    handler.log_message = lambda *args: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def chromium():
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary, "Debian's chromium is needed: make test installs it"
    return binary


def render(url, tmp_path, screenshot=None):
    """The DOM after scripts ran, and optionally a PNG of the page."""
    profile = tmp_path / f"profile-{abs(hash(url))}"
    common = [
        chromium(),
        *CHROMIUM_FLAGS,
        f"--user-data-dir={profile}",
        "--virtual-time-budget=10000",
    ]
    dom = subprocess.run(
        [*common, "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    if screenshot is not None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                *common,
                "--window-size=1280,1600",
                f"--screenshot={SHOTS / screenshot}",
                url,
            ],
            capture_output=True,
            timeout=120,
            check=True,
        )
        assert (SHOTS / screenshot).stat().st_size > 10_000
    return dom


def visible_text(dom):
    """Page text without scripts, styles and KaTeX's TeX annotations."""
    dom = re.sub(
        r"<(script|style|annotation)[^>]*>.*?</\1>", "", dom, flags=re.S
    )
    text = html.unescape(re.sub(r"<[^>]+>", "", dom))
    return " ".join(text.split())


def test_built_html_loads_nothing_from_the_network():
    pages = list(SITE.rglob("*.html"))
    assert len(pages) > 10
    # Loaded resources only: a rel="canonical" link is an address, not a load.
    external = re.compile(
        r'<(script|img|link(?![^>]*rel="canonical"))[^>]+(src|href)="(https?:)?//'
    )
    for page in pages:
        match = external.search(page.read_text(encoding="utf-8"))
        assert match is None, f"{page}: {match.group(0)}"
    assert (SITE / "assets" / "katex" / "katex.min.js").exists()


def test_home_page_renders(server, tmp_path):
    dom = render(f"{server}/", tmp_path, "home.png")
    text = visible_text(dom)
    assert "keras_attention" in text
    assert "pip install" in text


def test_concepts_page_math_is_typeset(server, tmp_path):
    dom = render(
        f"{server}/concepts/scaled-dot-product/", tmp_path, "concepts.png"
    )
    assert dom.count('class="katex"') >= 5
    assert 'class="katex-display"' in dom
    text = visible_text(dom)
    for raw in ("\\(", "\\[", "$$"):
        assert raw not in text, f"untypeset math: {raw}"
    assert "0.881" in text


def test_api_page_lists_the_arguments(server, tmp_path):
    dom = render(f"{server}/api/transformer/", tmp_path, "api.png")
    text = visible_text(dom)
    assert "MultiHeadSelfAttention" in text
    for argument in ("num_heads", "num_key_value_heads", "use_rotary"):
        assert argument in text
    assert 'class="katex"' in dom  # the equation in the class docstring
