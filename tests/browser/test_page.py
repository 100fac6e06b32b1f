"""The search page at / in a real browser (Debian's chromium, headless, driven by Playwright) against a real
``regis serve`` on loopback over the bundled photos and the offline backbone (issue 25, item 7: thumbnails in
their own aspect ratio, the relevance cut and its slider, the full-size viewer and its keys, plain words on the
surface and the token table behind "details", a weak result's explanation).

The page's index is built as a new index is by default (the default backbone, both framings scored apart), so the
screenshots show what a new user sees. Set ``REGIS_SCREENSHOT_DIR`` to also save every screenshot there (the README's
docs/img/results.png and explain.png come from ``REGIS_SCREENSHOT_DIR=DIR pytest tests/browser/test_page.py``).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from PIL import Image

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _serve(args: list[str], log: Path, env: dict | None = None):
    """``regis serve ARGS`` on a free loopback port until it answers /healthz; yields its URL, stops it after."""
    port = _free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "regis", "serve", *args, "--port", str(port), "--log-level", "warning"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "REGIS_TORCH_THREADS": "1", **(env or {})},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"regis serve did not start: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def default_index(photos_dir, tmp_path_factory) -> Path:
    """The photos indexed as a new index is by default (``regis.index_encoder.encoder_for`` without options: the
    default backbone, both framings scored apart, "center-crop+aspect" / "best"; ~1.2 s)."""
    from conftest import build
    from regis.index_encoder import encoder_for

    index = tmp_path_factory.mktemp("default-index")
    build(photos_dir, index, encoder_for(None, None, None, False, None, None, "cpu"))
    return index


@pytest.fixture(scope="module")
def server(default_index, tmp_path_factory):
    """``regis serve`` over the photos' default index (what a new user's index looks like); stopped after the
    module."""
    with _serve(["--index", str(default_index)], tmp_path_factory.mktemp("serve") / "serve.log") as url:
        yield url


@pytest.fixture()
def query_file(photos_dir, tmp_path) -> Path:
    """A partial view of chelsea the cat: the left two thirds of the photo, downscaled, JPEG q70."""
    img = Image.open(photos_dir / "skimage-chelsea.png").convert("RGB")
    w, h = img.size
    crop = img.crop((0, 0, int(w * 0.62), h)).resize((int(w * 0.62 * 0.8), int(h * 0.8)), Image.BICUBIC)
    buf = io.BytesIO()
    crop.save(buf, format="JPEG", quality=70)
    path = tmp_path / "cat-query.jpg"
    path.write_bytes(buf.getvalue())
    return path


def _screenshot(locator, path: Path) -> None:
    """Save a screenshot of ``locator``; also into $REGIS_SCREENSHOT_DIR when set (the README's images)."""
    locator.screenshot(path=str(path))
    if os.environ.get("REGIS_SCREENSHOT_DIR"):
        shutil.copy(path, Path(os.environ["REGIS_SCREENSHOT_DIR"]) / path.name)


def _first_name(page) -> str:
    return page.locator("#results .tile .name").first.get_attribute("title")


PLAIN_WORDS_ONLY = ("MaxSim", "CLS", "cls", "ROI", "roi-", "pass2", "register", "token")


def _assert_plain_words(page, selector: str) -> None:
    """The rendered text of ``selector`` (what a user reads: closed <details> excluded) has no jargon."""
    text = page.evaluate(f"document.querySelector({selector!r}).innerText")
    for word in PLAIN_WORDS_ONLY:
        assert word not in text, (word, text)


def test_search_viewer_relevance_cut_explanation_and_errors(browser, server, default_index, query_file, tmp_path):
    from regis.indexes.snapshot import IndexSnapshot
    from regis.models.geometry import image_grids

    page = browser.new_page(viewport={"width": 1200, "height": 1000})
    try:
        page.goto(server)
        page.wait_for_function("document.getElementById('status').textContent.includes('images to search')")
        page.check("#exact")  # every photo scored: the score distribution covers the whole gallery
        page.set_input_files("#file", str(query_file))
        page.wait_for_selector("#results .tile")
        assert _first_name(page) == "skimage-chelsea.png"
        # the relevance cut: set from the scores, not a fixed 12 (here only the cat clears it); the slider shows
        # more or fewer
        shown = page.locator("#results .tile").count()
        cut = int(page.input_value("#threshold"))
        sims = [int(t[:-1]) for t in page.locator("#results .tile .sim").all_text_contents()]
        assert 1 <= shown < 21 and all(s >= cut for s in sims), (shown, cut, sims)
        assert f"{shown} of 21 results shown" == page.text_content("#cutCount")
        _screenshot(page, tmp_path / "results-cut.png")
        page.fill("#threshold", "0")
        page.wait_for_function("document.querySelectorAll('#results .tile').length === 21")
        page.wait_for_function("[...document.querySelectorAll('#results .tile img')]"
                               ".every(i => i.complete && i.naturalWidth > 0)")
        _screenshot(page, tmp_path / "results.png")

        # thumbnails keep their aspect ratio (the photo's width / height, as the index has it)
        shapes = page.evaluate("""[...document.querySelectorAll('#results .tile img')].map(i => [
            i.getBoundingClientRect().width / i.getBoundingClientRect().height,
            Number(i.getAttribute('width')) / Number(i.getAttribute('height'))])""")
        for shown_ratio, photo in shapes:
            assert shown_ratio == pytest.approx(photo, rel=0.02)
        assert len({round(r, 2) for _, r in shapes}) > 3  # the photos differ in shape: not one fixed crop
        page.fill("#threshold", "100")
        page.wait_for_function("document.querySelectorAll('#results .tile').length <= 1")
        page.click("#cutReset")
        page.wait_for_function(f"document.querySelectorAll('#results .tile').length === {shown}")
        _assert_plain_words(page, "main")

        # the full-size viewer: the image file itself, arrow keys go through the results shown
        page.fill("#threshold", "0")
        page.wait_for_function("document.querySelectorAll('#results .tile').length === 21")
        page.locator("#results .tile button.open").first.click()
        page.wait_for_selector("#viewer[open]")
        page.wait_for_function("document.getElementById('viewerImg').naturalWidth > 0")
        assert page.evaluate("document.getElementById('viewerImg').naturalWidth") == 451  # chelsea, full size
        assert page.text_content("#viewerRank") == "#1"
        _screenshot(page, tmp_path / "viewer.png")
        page.keyboard.press("ArrowRight")
        page.wait_for_function("document.getElementById('viewerRank').textContent === '#2'")
        page.keyboard.press("ArrowLeft")
        page.wait_for_function("document.getElementById('viewerRank').textContent === '#1'")
        page.keyboard.press("w")  # why it matched: the viewer gives way to the explanation
        page.wait_for_selector("#detail[open]")
        assert not page.locator("#viewer").evaluate("d => d.open")

        # the explanation: plain words and matched regions first, the token table behind "details"
        page.wait_for_function("document.getElementById('rImg').complete && document.getElementById('qImg').complete")
        assert page.text_content("#verdict").startswith(("Near-identical", "Good match"))
        assert page.locator("#summary li.whole").count() == 1 and page.locator("#summary li.region").count() == 3
        # two framings scored apart: the words say which won; only its 5 regions of the query are drawn
        won = "whole" if page.inner_text("#framing").startswith("Scored on the whole image: ") else "crop"
        assert won == "whole" or page.inner_text("#framing").startswith("Scored on the centre crop: ")
        assert page.locator("#qSvg rect.box").count() == 5  # the query's 5 regions (of the winning framing)
        assert page.locator("#rSvg rect.box").count() >= 1
        assert not page.locator("table.matches").is_visible()
        _assert_plain_words(page, "#detail")
        _screenshot(page.locator("#detail"), tmp_path / "explain.png")
        page.click("#tokenDetails summary")
        assert page.locator("table.matches").is_visible()
        assert page.locator("#matchRows tr").count() == 15  # the winning framing's 15 query tokens (query_layout)
        page.locator("#matchRows tr").nth(5).locator("button.heat").click()
        page.wait_for_selector("#rSvg g.heatmap rect")
        # the 160 px ROI pass's patches: the centre crop's 5 x 5, or the whole cat photo's own grid (451 x 300)
        rows, cols = image_grids(IndexSnapshot.open(default_index).manifest.encoder, 451, 300)[1] if won == "whole" \
            else (5, 5)
        assert page.locator("#rSvg g.heatmap rect").count() == rows * cols
        _screenshot(page.locator("#detail .pair"), tmp_path / "explain-heatmap.png")
        page.click("#detailClose")

        # a weak result (below the cut, shown by moving the slider) still says what was compared
        page.locator("#results .tile button.why").last.click()
        page.wait_for_selector("#detail[open]")
        assert page.text_content("#verdict").startswith("Weak match")
        assert page.locator("#summary li.whole").count() == 1 and page.locator("#summary li.region").count() == 3
        assert page.inner_text("#framing").startswith("Scored on ")  # two framings: the one it was scored on
        assert all("% similar" in t for t in page.locator("#summary li.whole, #summary li.region").all_text_contents())
        _assert_plain_words(page, "#detail")
        _screenshot(page.locator("#detail"), tmp_path / "explain-weak.png")

        # more like this: the result becomes the query (searched by id, its stored tokens) and finds itself
        # first at 100 %
        page.click("#detailClose")
        page.locator("#results .tile button.more").first.click()
        page.wait_for_function(
            "document.querySelector('#results .tile .sim')?.textContent === '100%'")
        assert _first_name(page) == "skimage-chelsea.png"

        # a file that is not an image: an error in words, and the page keeps working
        page.set_input_files("#file", files=[{"name": "notes.txt", "mimeType": "text/plain",
                                              "buffer": b"these are not pixels"}])
        page.wait_for_selector("#error:not([hidden])")
        assert "not an image" in page.text_content("#error")
        page.set_input_files("#file", str(query_file))
        page.wait_for_selector("#error", state="hidden")
        page.wait_for_selector("#results .tile")
        assert _first_name(page) == "skimage-chelsea.png"
    finally:
        page.close()


def test_phone_sized_window(browser, server, query_file, tmp_path):
    page = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2)
    try:
        page.goto(server)
        page.set_input_files("#file", str(query_file))
        page.wait_for_selector("#results .tile")
        assert page.evaluate("document.documentElement.scrollWidth") <= 390  # no sideways scrolling
        assert not page.locator("#collectionBox").is_visible()  # one collection: no picker
        page.wait_for_function("[...document.querySelectorAll('#results .tile img')]"
                               ".every(i => i.complete && i.naturalWidth > 0)")
        _screenshot(page, tmp_path / "phone-results.png")
        page.locator("#results .tile button.why").first.click()
        page.wait_for_selector("#detail[open]")
        q, r = page.locator("#qStage").bounding_box(), page.locator("#rStage").bounding_box()
        assert r["y"] >= q["y"] + q["height"] - 1  # the two images stack
        assert q["x"] + q["width"] <= 391 and r["x"] + r["width"] <= 391
        page.wait_for_function("document.getElementById('rImg').complete && document.getElementById('qImg').complete")
        _screenshot(page, tmp_path / "phone-explain.png")
        page.click("#detailClose")
        page.locator("#results .tile button.open").first.click()  # the viewer fits the phone
        page.wait_for_selector("#viewer[open]")
        page.wait_for_function("document.getElementById('viewerImg').naturalWidth > 0")
        box = page.locator("#viewerImg").bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 391
    finally:
        page.close()


@pytest.mark.heavy  # its own regis serve and index: 12.9 s of make test at load 5.6-7.5 (make test-heavy runs it)
def test_collection_picker_starts_on_the_first_collection_with_images(browser, lite0_index, lite0_encoder,
                                                                      photos_dir, tmp_path):
    """A collections root without a default collection: "later" (empty), "tools" (3 photos), "zoo" (all 21); the
    page starts on tools, the first that has images, and searches the one picked."""
    from conftest import build
    from regis.indexes.collections import CollectionConfig, CollectionsRoot

    root = CollectionsRoot(tmp_path / "collections")
    root.create("later", CollectionConfig(backbone="efficientnet-lite0"))
    shutil.copytree(lite0_index, root.path("zoo"))
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("skimage-rocket.jpg", "skimage-coffee.png", "skimage-motorcycle_left.png"):
        shutil.copy(photos_dir / name, tools / name)
    build(tools, root.create("tools", CollectionConfig(backbone="efficientnet-lite0")), lite0_encoder)
    with _serve([], tmp_path / "serve.log", {"REGIS_COLLECTIONS_ROOT": str(root.root)}) as url:
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        try:
            page.goto(url)
            page.wait_for_selector("#collectionBox:not([hidden])")
            assert page.locator("#collection option").count() == 3
            assert page.input_value("#collection") == "tools"
            page.set_input_files("#file", str(photos_dir / "skimage-rocket.jpg"))
            page.wait_for_selector("#results .tile")
            assert page.text_content("#cutCount").endswith("of 3 results shown")
            assert _first_name(page) == "skimage-rocket.jpg"
            page.locator("#results .tile button.why").first.click()
            page.wait_for_selector("#detail[open]")
            page.wait_for_function("document.getElementById('rImg').complete && "
                                   "document.getElementById('rImg').naturalWidth > 0")
            assert page.locator("#rSvg rect.box").count() >= 1
            assert "/v1/collections/tools/images/" in page.get_attribute("#rImg", "src")
            page.click("#detailClose")
            page.select_option("#collection", "zoo")
            page.wait_for_function("!document.getElementById('cutCount').textContent.endsWith('of 3 results shown')")
            assert _first_name(page) == "skimage-rocket.jpg"
        finally:
            page.close()


def _image_shown(page, selector: str) -> bool:
    return page.evaluate(f"[...document.querySelectorAll({selector!r})].every(i => i.complete && i.naturalWidth > 0)")


@pytest.mark.heavy  # its own regis serve: 13.2 s of make test at load 5.6-7.5 (make test-heavy runs it)
def test_api_key_field_when_the_server_requires_keys(browser, lite0_index, query_file, tmp_path):
    """With keys required (the docker-compose default) the page asks for a key, says when one is refused, and with
    a valid read key searches, shows the thumbnails (fetched with the header) and explains; the key is kept."""
    from service.keys import create_key

    keys = tmp_path / "keys.json"
    key, _ = create_key(keys, "read", "browser test")
    with _serve(["--index", str(lite0_index)], tmp_path / "serve.log", {"REGIS_API_KEYS_FILE": str(keys)}) as url:
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        try:
            page.goto(url)
            page.wait_for_selector("#error:not([hidden])")
            assert "needs an API key" in page.text_content("#error")
            assert page.locator("#apiKey").is_visible()
            _screenshot(page.locator("main"), tmp_path / "key-needed.png")

            # a search without a key is refused in the same words; nothing is shown
            with page.expect_response(lambda r: "/v1/search" in r.url) as refused:
                page.set_input_files("#file", str(query_file))
            assert refused.value.status == 401
            page.wait_for_selector("#error:not([hidden])")
            assert "needs an API key" in page.text_content("#error")
            assert page.locator("#results .tile").count() == 0

            # an unknown key: refused, said so
            page.fill("#apiKey", "regis_00000000_not-a-key")
            page.press("#apiKey", "Enter")
            page.wait_for_function("document.getElementById('error').textContent.includes('Key refused')")
            assert page.locator("#results .tile").count() == 0

            # the valid key: the pending query is searched; the cat first, thumbnails and the explanation load
            page.fill("#apiKey", key)
            with page.expect_response(lambda r: "/v1/search" in r.url) as accepted:
                page.press("#apiKey", "Enter")
            assert accepted.value.status == 200
            page.wait_for_selector("#results .tile")
            assert page.locator("#error").is_hidden()
            assert _first_name(page) == "skimage-chelsea.png"
            page.wait_for_function("[...document.querySelectorAll('#results .tile img')]"
                                   ".every(i => i.complete && i.naturalWidth > 0)")
            assert page.get_attribute("#results .tile img", "src").startswith("blob:")
            _screenshot(page.locator("main"), tmp_path / "key-results.png")
            page.locator("#results .tile button.why").first.click()
            page.wait_for_selector("#detail[open]")
            page.wait_for_function("document.getElementById('rImg').naturalWidth > 0")
            assert page.locator("#rSvg rect.box").count() >= 1
            page.click("#detailClose")

            # kept in this browser: after a reload the page searches with it without asking again
            page.reload()
            page.wait_for_function("document.getElementById('status').textContent.includes('images to search')")
            assert page.input_value("#apiKey") == key
            page.set_input_files("#file", str(query_file))
            page.wait_for_selector("#results .tile")
            assert page.locator("#error").is_hidden()
            assert _first_name(page) == "skimage-chelsea.png"
        finally:
            page.close()
