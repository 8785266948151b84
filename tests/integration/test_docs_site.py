"""The built documentation site, rendered in headless Chromium offline.

`make test` builds the site (`mkdocs build --strict`) and installs Debian's
chromium if it is missing before running this. The pages are served from
127.0.0.1 and Chromium runs with its background networking off, so math
that typesets here typesets with no network. `audit` loads every page in
that chromium through Playwright (the DevTools protocol) and lists each
defect. DOCS_SITE=path checks another build.
"""

import collections
import contextlib
import functools
import html
import http.server
import os
import re
import shutil
import subprocess
import threading
import urllib.parse
from pathlib import Path

import keras
import pytest
from PIL import Image
from PIL import PngImagePlugin
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("DOCS_SITE", ROOT / "site"))
SHOTS = ROOT / "build" / "docs-screenshots"
OFFLINE_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
]
CHROMIUM_FLAGS = ["--headless", *OFFLINE_FLAGS]

# The site does not depend on the backend: check it once, in one process.
pytestmark = [
    pytest.mark.skipif(
        keras.backend.backend() != "jax",
        reason="backend-independent; runs in the JAX pass only",
    ),
    pytest.mark.slow,
]


@contextlib.contextmanager
def serve(directory):
    """Serves `directory` on 127.0.0.1; yields the base address."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(directory))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def server():
    assert (SITE / "index.html").exists(), "run `make docs` first"
    with serve(SITE) as address:
        yield address


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
    dom = render(
        f"{server}/api/layers/multi-head-self-attention/", tmp_path, "api.png"
    )
    text = visible_text(dom)
    assert "MultiHeadSelfAttention" in text
    for argument in ("num_heads", "num_key_value_heads", "use_rotary"):
        assert argument in text
    assert 'class="katex"' in dom  # the equation in the class docstring


# Pages taller than this at 1280 px (the API reference with every
# inherited method on every layer was 27,000 px) are split or trimmed.
MAX_PAGE_HEIGHT = 24_000

# One pass over a rendered page at 1280 px, in the page: raw TeX left in
# text outside code, tables and display equations wider than the content
# column with no scroll bar, large images shown small with no link to
# them, identifiers in tables broken inside a word (between two word
# characters), a page taller than MAX_PAGE_HEIGHT; and its links, ids
# and images, which `audit` checks against the site (a PNG figure must
# say what its colours mean: see `unexplained_figure`).
AUDIT_JS = r"""
async (maxHeight) => {
  const clip = (text) => text.replace(/\s+/g, " ").trim().slice(0, 60);
  const found = [];
  await document.fonts.ready;
  const images = [...document.images];
  for (const img of images) img.loading = "eager";
  await Promise.all(images.map((img) => img.decode().catch(() => null)));

  const code = "script, style, noscript, textarea, pre, code, kbd, .katex";
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const text = walker.currentNode.data;
    const at = text.search(/\$|\\[([]/);
    if (at >= 0 && !walker.currentNode.parentElement.closest(code)) {
      const near = text.slice(Math.max(0, at - 20), at + 40);
      found.push(["math", `raw TeX in "${clip(near)}"`]);
    }
  }
  for (const error of document.querySelectorAll(".katex-error")) {
    const why = error.title || error.textContent;
    found.push(["math", "KaTeX error: " + clip(why)]);
  }

  const column = document.querySelector(".md-content");
  const box = column && column.getBoundingClientRect();
  const px = (x) => Math.round(x) + " px";
  const overflow = (el) => {
    const rect = el.getBoundingClientRect();
    if (!rect.width) return null;  // in a closed tab or <details>
    for (let node = el; node !== column; node = node.parentElement) {
      if (node.scrollWidth <= node.clientWidth + 1) continue;
      const style = getComputedStyle(node).overflowX;
      if (style === "auto" || style === "scroll") {
        const r = node.getBoundingClientRect();
        const fits = r.left >= box.left - 1 && r.right <= box.right + 1;
        return fits ? null : `its scroll box is ${px(r.width)} wide`;
      }
      if (style !== "visible") {
        const hidden = node.scrollWidth - node.clientWidth;
        return `${px(hidden)} cut off by overflow-x: ${style}`;
      }
    }
    const right = Math.max(rect.right, rect.left + el.scrollWidth);
    if (right <= box.right + 1 && rect.left >= box.left - 1) return null;
    return `${px(right - rect.left)} wide, past the ${px(box.width)} ` +
      "content column, with no scroll bar";
  };
  const wide = box ? column.querySelectorAll("table, .katex-display") : [];
  for (const el of wide) {
    const problem = overflow(el);
    if (!problem) continue;
    const tex = el.querySelector("annotation");
    const what = el.matches("table")
      ? `table "${clip(el.rows[0]?.textContent || "")}"`
      : `equation "${clip((tex || el).textContent)}"`;
    found.push(["overflow", what + " is " + problem]);
  }

  for (const img of images) {
    const shown = img.getBoundingClientRect().width;
    if (shown && img.naturalWidth > 3 * shown && !img.closest("a[href]")) {
      found.push(["image", `${img.getAttribute("src")} is ` +
        `${px(img.naturalWidth)} wide, shown at ${px(shown)}, unlinked`]);
    }
  }
  const lineOf = (node, at) => {
    const range = document.createRange();
    range.setStart(node, at);
    range.setEnd(node, at + 1);
    const rect = [...range.getClientRects()].find((r) => r.width > 0);
    return rect ? Math.round(rect.top) : null;
  };
  for (const code of document.querySelectorAll(".md-content table code")) {
    const texts = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    const chars = [];  // [node, offset] of every character, in order
    while (texts.nextNode()) {
      const node = texts.currentNode;
      for (let i = 0; i < node.data.length; i++) chars.push([node, i]);
    }
    for (let i = 1; i < chars.length; i++) {
      const [a, j] = chars[i - 1], [b, k] = chars[i];
      if (!/\w/.test(a.data[j]) || !/\w/.test(b.data[k])) continue;
      const before = lineOf(a, j), after = lineOf(b, k);
      if (before !== null && after !== null && after > before) {
        found.push(["wrap", `"${clip(code.textContent)}" broken at ` +
          `"${a.data[j]}|${b.data[k]}"`]);
        break;
      }
    }
  }
  const height = document.documentElement.scrollHeight;
  if (height > maxHeight) {
    found.push(["height", `${px(height)} tall, over ${px(maxHeight)}`]);
  }

  const links = [...document.querySelectorAll("a[href]")].map(
    (a) => new URL(a.getAttribute("href"), document.baseURI).href);
  const ids = [...document.querySelectorAll("[id], a[name]")].map(
    (el) => el.id || el.getAttribute("name"));
  const figures = images.map((img) => img.currentSrc || img.src);
  return { found, links, ids, figures };
}
"""


def is_local(url):
    parts = urllib.parse.urlsplit(url)
    local = parts.hostname in ("127.0.0.1", "localhost")
    return local or parts.scheme in ("data", "blob", "about")


def site_url(site):
    """The address the site is published at, from its sitemap, if any."""
    sitemap = site / "sitemap.xml"
    if not sitemap.exists():
        return None
    locs = re.findall(r"<loc>(.*?)</loc>", sitemap.read_text("utf-8"))
    return min(locs, key=len) if locs else None


def audit(site, browser, tabs=4):
    """Every defect of every page of `site`, as "page: kind: detail"."""
    folders = (p.parent.relative_to(site) for p in site.rglob("index.html"))
    pages = sorted(f"/{f.as_posix()}/".replace("/./", "/") for f in folders)
    defects, links, ids = [], {}, {}
    with serve(site) as address:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        # Recorded, then refused: the check needs no network either.
        context.route(lambda url: not is_local(url), lambda r: r.abort())
        # A few pages load at once, so their idle waits overlap.
        for start in range(0, len(pages), tabs):
            batch = pages[start : start + tabs]
            opened = [open_tab(context, address + page) for page in batch]
            for page, (tab, requested) in zip(batch, opened, strict=True):
                # Network idle alone can come before "load" on a busy CPU,
                # that is before the math is typeset.
                tab.wait_for_load_state("load")
                tab.wait_for_load_state("networkidle")
                result = tab.evaluate(AUDIT_JS, MAX_PAGE_HEIGHT)
                tab.close()
                defects += [(page, *defect) for defect in result["found"]]
                defects += [
                    (page, "network", f"request to {url[:100]}")
                    for url in dict.fromkeys(requested)
                    if not is_local(url)
                ]
                links[page] = result["links"]
                defects += [
                    (page, "legend", problem)
                    for url in dict.fromkeys(result["figures"])
                    if (problem := unexplained_figure(site, url, address))
                ]
                ids[site / page[1:] / "index.html"] = set(result["ids"])
        context.close()
    bases = [b for b in (address + "/", site_url(site)) if b]
    for page, urls in links.items():
        for url in dict.fromkeys(urls):
            problem = broken_link(site, url, bases, ids)
            if problem:
                defects.append((page, "link", problem))
    return [": ".join(defect) for defect in defects]


def open_tab(context, url):
    """A tab starting to load `url`, and the list of what it requests.

    Playwright reports each request from the DevTools protocol's network
    events, the page's workers' included.
    """
    tab = context.new_page()
    requested = []
    tab.on("request", lambda request: requested.append(request.url))
    tab.on("websocket", lambda socket: requested.append(socket.url))
    tab.goto(url, wait_until="commit")
    return tab, requested


def unexplained_figure(site, url, address):
    """Why a PNG figure of the site does not say what its colours mean, or
    None if it does. `keras_attention.visualization.save_figure` writes
    the figure's legends and colour bars into the PNG's `Legend` text
    entry; a figure saved without a legend or a colour bar has it empty."""
    if not url.startswith(address + "/") or not url.endswith(".png"):
        return None
    path = urllib.parse.unquote(urllib.parse.urlsplit(url).path)
    with Image.open(site / path.lstrip("/")) as image:
        legend = image.text.get("Legend")
    if legend is None:
        return f"{path} was not saved with save_figure (no Legend entry)"
    if not legend:
        return f"{path} has no legend and no colour bar"
    return None


def broken_link(site, url, bases, ids):
    """Why a link into the site leads nowhere, or None if it does not."""
    base = next((b for b in bases if url.startswith(b)), None)
    if base is None:
        return None  # another site
    parts = urllib.parse.urlsplit(url[len(base) :])
    path = urllib.parse.unquote(parts.path)
    target = site / path
    if target.is_dir():
        target /= "index.html"
    if not target.is_file():
        return f"/{path} does not exist"
    fragment = urllib.parse.unquote(parts.fragment)
    if not fragment or target.suffix != ".html":
        return None
    if target not in ids:  # a page not audited, such as 404.html
        text = target.read_text("utf-8")
        ids[target] = set(re.findall(r'\b(?:id|name)="([^"]*)"', text))
    if fragment not in ids[target]:
        return f"/{path}#{parts.fragment}: no id {fragment!r} there"
    return None


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium(), args=OFFLINE_FLAGS
        )
        yield browser
        browser.close()


def test_every_page_is_typeset_offline_fits_and_links(browser):
    assert (SITE / "index.html").exists(), "run `make docs` first"
    defects = audit(SITE, browser)
    if defects:
        kinds = collections.Counter(d.split(": ")[1] for d in defects)
        pytest.fail(
            f"{len(defects)} defects {dict(kinds)} in {SITE}:\n"
            + "\n".join(defects),
            pytrace=False,
        )


WIDE_SVG = '<svg xmlns="http://www.w3.org/2000/svg" width="1200" height="40"/>'
PAGE = """<!doctype html><meta charset="utf-8"><title>{title}</title>
<body style="margin:0"><div class="md-content" style="width:400px">
{body}</div>"""
GOOD_BODY = r"""<p>Typeset <span class="katex"><annotation>\(x\)</annotation>
</span> and <code>$ echo \(x\) \[y\]</code>.</p>
<div style="overflow-x:auto"><table style="width:900px"><tr><td>scrolls
</td></tr></table></div>
<a href="wide.svg"><img src="wide.svg" style="width:100px"></a>
<img src="keyed.png">
<a href="bad/#here">anchor</a> <a href="https://example.com/">elsewhere</a>
<table style="width:120px"><tr><td><code>sliding_window=(left, right)
--sliding-window</code></td></tr></table>
"""
BAD_BODY = r"""<link rel="stylesheet" href="https://cdn.example.com/katex.css">
<p id="here">Raw \(x^2\).</p>
<span class="katex-error" title="ParseError: Unexpected end">\frac{</span>
<table style="width:900px"><tr><td>too wide</td></tr></table>
<div style="overflow:hidden"><div class="katex-display" style="width:900px">
cut off</div></div>
<img src="../wide.svg" style="width:100px">
<img src="../keyed.png"> <img src="../unkeyed.png"> <img src="../plain.png">
<a href="../missing/">gone</a> <a href="../#nowhere">no anchor</a>
<table style="width:120px"><tr><td><code style="word-break:break-all">
MultiHeadSelfAttention</code></td></tr></table>
<div style="height:{height}px"></div>
"""


def write_png(path, legend=None):
    info = PngImagePlugin.PngInfo()
    if legend is not None:
        info.add_text("Legend", legend)
    Image.new("RGB", (40, 30), "white").save(path, pnginfo=info)


def test_the_audit_finds_each_kind_of_defect(browser, tmp_path):
    (tmp_path / "wide.svg").write_text(WIDE_SVG)
    write_png(tmp_path / "keyed.png", "legend: may attend, masked out")
    write_png(tmp_path / "unkeyed.png", "")
    write_png(tmp_path / "plain.png")
    (tmp_path / "index.html").write_text(
        PAGE.format(title="good", body=GOOD_BODY)
    )
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "index.html").write_text(
        PAGE.format(
            title="bad",
            body=BAD_BODY.replace("{height}", str(MAX_PAGE_HEIGHT + 100)),
        )
    )
    defects = audit(tmp_path, browser)
    found = collections.Counter(tuple(d.split(": ")[:2]) for d in defects)
    expected = {
        "math": 2,
        "network": 1,
        "overflow": 2,
        "link": 2,
        "image": 1,
        "wrap": 1,
        "height": 1,
        "legend": 2,
    }
    assert found == {("/bad/", k): n for k, n in expected.items()}, defects
