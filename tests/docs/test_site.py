"""The built site: one page and the atlas figures per registered encoding, nothing loaded from
outside the site, and every page rendered by a real headless browser (Debian's chromium,
driven by Playwright) without console errors or failed requests.

The site is the one ``make docs`` built when ``RELPOS_DOCS_SITE`` names its folder (``make
test-slow`` does); otherwise it is built here, strictly, into a temporary folder.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import relpos
from relpos_lab.docsite import atlas

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
#: the switches the browser runs with (as root it needs --no-sandbox)
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    given = os.environ.get("RELPOS_DOCS_SITE")
    if given:
        path = (ROOT / given).resolve()
        assert (path / "index.html").is_file(), f"RELPOS_DOCS_SITE={given}: no built site there"
        return path
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), str(ROOT / "lab" / "src"), env.get("PYTHONPATH", "")]
    )
    env.pop("RELPOS_DOCS_ENCODINGS", None)  # the whole registry
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    return out


def test_one_page_and_atlas_figures_per_registered_encoding(site):
    for name in relpos.available():
        page = site / "encodings" / f"{name}.html"
        assert page.is_file(), name
        html = page.read_text(encoding="utf-8")
        views = atlas.views(atlas.atlas_encoding(name).encoding)
        for view in views:
            figure = site / "atlas" / f"{name}-{view}.png"
            assert figure.is_file() and figure.stat().st_size > 1000, figure
            assert f"../atlas/{name}-{view}.png" in html, (name, view)
    atlas_html = (site / "atlas.html").read_text(encoding="utf-8")
    for name in relpos.available():
        assert f'href="encodings/{name}.html"' in atlas_html, name


class _Resources(HTMLParser):
    """The URLs a page loads by itself: scripts, stylesheets, icons, fonts, images, media."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag in ("script", "img", "iframe", "audio", "video", "source", "embed") and a.get("src"):
            self.urls.append(a["src"] or "")
        if tag == "link" and a.get("href") and a.get("rel") not in ("next", "prev", "canonical"):
            self.urls.append(a["href"] or "")
        if tag == "object" and a.get("data"):
            self.urls.append(a["data"] or "")


def _external(url: str) -> bool:
    return bool(re.match(r"^(https?:)?//", url.strip(), flags=re.I))


def test_nothing_is_loaded_from_outside_the_site(site):
    pages = sorted(site.rglob("*.html"))
    for page in pages:
        parser = _Resources()
        parser.feed(page.read_text(encoding="utf-8"))
        outside = [u for u in parser.urls if _external(u)]
        assert not outside, (page.relative_to(site), outside)
    for css in site.rglob("*.css"):
        text = css.read_text(encoding="utf-8")
        imports = re.findall(r"@import\s+(?:url\()?['\"]?([^'\")\s;]+)", text)
        urls = re.findall(r"url\(\s*['\"]?([^'\")]+)", text)
        outside = [u for u in imports + urls if _external(u)]
        assert not outside, (css.relative_to(site), outside)
    assert len(pages) > len(relpos.available())


@pytest.fixture(scope="module")
def served(site) -> Iterator[str]:
    """The site over HTTP on 127.0.0.1 (the search worker does not run from file://)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(site))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_every_page_renders_in_chromium_without_errors(site, served, tmp_path):
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: `make browser` installs it"
    from playwright.sync_api import sync_playwright

    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html"))
    problems: dict[str, list[str]] = {}
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"),  # a fresh user data dir
            executable_path=chromium,
            headless=True,
            args=CHROMIUM_ARGS,
        )
        try:
            page = context.new_page()
            current: list[str] = []
            page.on(
                "console",
                lambda m: (
                    current.append(f"console {m.type}: {m.text}")
                    if m.type in ("error", "assert")
                    else None
                ),
            )
            page.on("pageerror", lambda e: current.append(f"page error: {e}"))
            page.on(
                "requestfailed", lambda r: current.append(f"request failed: {r.url} {r.failure}")
            )
            page.on(
                "response",
                lambda r: current.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None,
            )
            page.on(
                "request",
                lambda r: (
                    current.append(f"request outside the site: {r.url}")
                    if urlsplit(r.url).hostname not in ("127.0.0.1", None)
                    and not r.url.startswith(("data:", "blob:"))
                    else None
                ),
            )
            for path in pages:
                current.clear()
                page.goto(f"{served}/{path}", wait_until="load")
                page.wait_for_load_state("networkidle")
                title = page.locator("article h1").first.inner_text()
                if not title.strip():
                    current.append("no title")
                broken = page.evaluate(
                    "Array.from(document.images)"
                    ".filter(i => i.loading !== 'lazy' && (!i.complete || i.naturalWidth === 0))"
                    ".map(i => i.src)"
                )
                current += [f"image not shown: {src}" for src in broken]
                if current:
                    problems[path] = list(current)
        finally:
            context.close()
    assert not problems, problems
    assert len(pages) >= len(relpos.available()) + 10


def test_search_finds_an_encoding(site, served, tmp_path):
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: `make browser` installs it"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=chromium, headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = context.new_page()
            page.goto(f"{served}/index.html", wait_until="load")
            page.locator("label.md-search__icon, .md-search__input").first.click()
            page.locator("input.md-search__input").fill("kerple")
            result = page.locator(".md-search-result__item a").first
            result.wait_for(timeout=30_000)
            assert "kerple" in (result.get_attribute("href") or "")
        finally:
            context.close()
