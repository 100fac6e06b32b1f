"""The duplicates view at /duplicates in a real browser (Debian's chromium, headless, driven by Playwright) against
the service on loopback, over a small set of real photos indexed with the default encoder (issue 26, item 4):
groups with their thumbnails, the relation of each pair in words, crops and other shots beside the groups (never
in them), the side-by-side comparison with the matched regions (and the token matches), and "keep this one"
selecting the rest of its group for deletion: confirmed, refused to a read key, done with a write key.

Set ``REGIS_SCREENSHOT_DIR`` to also save the screenshots there (the README's docs/img/duplicates.png and
duplicates-crop.png come from ``REGIS_SCREENSHOT_DIR=docs/img pytest tests/browser/test_duplicates_page.py``).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from deploy.support import ServerThread, wait_until
from PIL import Image, ImageDraw, ImageFont

from tests.conftest import build

pytestmark = pytest.mark.slow


def _jpeg(img: Image.Image, path: Path, quality: int = 90) -> None:
    buf = io.BytesIO()
    img.convert("RGB").save(buf, format="JPEG", quality=quality)
    path.write_bytes(buf.getvalue())


def _captioned(img: Image.Image, text: str) -> Image.Image:
    img = img.copy()
    ImageDraw.Draw(img).text((12, img.height - 40), text, font=ImageFont.load_default(size=28),
                             fill=(255, 255, 255), stroke_width=2, stroke_fill=(0, 0, 0))
    return img


@pytest.fixture(scope="module")
def library(tmp_path_factory, photos_dir) -> Path:
    """Ten real-photo files as a photo library holds them: the cat photo, an edited copy (downscaled, captioned,
    JPEG q50) and a crop (40 % of its area); the astronaut photo, a byte copy and a grey, downscaled copy; two shots
    of the coffee scene by a moved camera (``regis.data.near_duplicates.shot_of``); two unrelated photos."""
    from regis.data.near_duplicates import shot_of

    out = tmp_path_factory.mktemp("library")
    cat = Image.open(photos_dir / "skimage-chelsea.png").convert("RGB")
    _jpeg(cat, out / "cat.jpg", 95)
    edit = _captioned(cat, "best cat").resize((cat.width * 6 // 10, cat.height * 6 // 10), Image.BICUBIC)
    _jpeg(edit, out / "cat-edited.jpg", 50)
    _jpeg(cat.crop((0, int(cat.height * 0.15), int(cat.width * 0.55), int(cat.height * 0.88))), out / "cat-crop.jpg")
    astronaut = Image.open(photos_dir / "skimage-astronaut.png").convert("RGB")
    _jpeg(astronaut, out / "astronaut.jpg", 92)
    shutil.copy(out / "astronaut.jpg", out / "astronaut (copy).jpg")
    _jpeg(astronaut.convert("L").resize((300, 300), Image.BICUBIC), out / "astronaut-grey-small.jpg", 70)
    coffee = Image.open(photos_dir / "skimage-coffee.png").convert("RGB")
    w, h = coffee.size
    rng = np.random.default_rng(0)
    for n, (x0, y0) in enumerate(((0.0, 0.0), (0.22 * w, 0.18 * h))):  # windows of 64 % of the scene, IoU 0.45
        data, _ = shot_of(coffee, (x0, y0, x0 + 0.8 * w, y0 + 0.8 * h), (round(0.7 * w), round(0.7 * h)), rng)
        (out / f"coffee-shot{n + 1}.jpg").write_bytes(data)
    for name in ("skimage-rocket.jpg", "sklearn-china.jpg"):
        shutil.copy(photos_dir / name, out / name)
    return out


@pytest.fixture(scope="module")
def server(library, tmp_path_factory):
    """The service over the library's index (default encoder), API keys required, deletes enabled; yields
    (url, read key, write key, {file name: image id})."""
    from regis.models.encoder import build_encoder
    from regis.models.registry import DEFAULT_BACKBONE
    from service.app import create_app
    from service.keys import create_key
    from service.settings import Settings

    tmp = tmp_path_factory.mktemp("dup-page")
    build(library, tmp / "index", build_encoder(DEFAULT_BACKBONE))
    read_key, _ = create_key(tmp / "keys.json", "read", "duplicates page, read")
    write_key, _ = create_key(tmp / "keys.json", "write", "duplicates page, write")
    settings = Settings(index_dir=tmp / "index", images_root=library, enable_jobs=True, index_poll_s=0.2,
                        api_keys_file=tmp / "keys.json", torch_threads=1)
    with ServerThread(create_app(settings)) as srv:
        listing = _get(f"{srv.url}/v1/images?limit=100", read_key)
        ids = {im["path"]: im["id"] for im in listing["images"]}
        yield srv.url, read_key, write_key, ids


def _get(url: str, key: str) -> dict:
    headers = {"X-API-Key": key} if key else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=120) as r:
        return json.loads(r.read())


def _screenshot(locator, path: Path) -> None:
    """Save a screenshot of ``locator``; also into $REGIS_SCREENSHOT_DIR when set (the README's images)."""
    locator.screenshot(path=str(path))
    if os.environ.get("REGIS_SCREENSHOT_DIR"):
        shutil.copy(path, Path(os.environ["REGIS_SCREENSHOT_DIR"]) / path.name)


def _card(page, image_id: int):
    return page.locator(f'#groups .card[data-id="{image_id}"]')


def test_groups_relations_comparison_and_keep_this_one(browser, server, tmp_path):
    url, read_key, write_key, ids = server
    page = browser.new_page(viewport={"width": 1200, "height": 1100})
    try:
        page.goto(f"{url}/duplicates")
        # keys are required: the page says so and shows the key field; a read key is enough to look
        page.wait_for_selector("#keyBox:not([hidden])")
        page.fill("#apiKey", read_key)
        page.dispatch_event("#apiKey", "change")
        page.wait_for_selector("#groups .group", timeout=180_000)  # the first run searches every image (202 polls)
        status = page.inner_text("#status")
        assert "2 duplicate groups" in status, status
        assert "not calibrated" not in status  # the default encoder's shipped calibration is in use

        groups = page.locator("#groups .group")
        members = [sorted(int(i) for i in g.locator(".strip:not(.related) .card").evaluate_all(
            "cs => cs.map(c => c.dataset.id)")) for g in groups.all()]
        copies = {"cat": sorted([ids["cat.jpg"], ids["cat-edited.jpg"]]),
                  "astronaut": sorted([ids["astronaut.jpg"], ids["astronaut (copy).jpg"],
                                       ids["astronaut-grey-small.jpg"]])}
        # the two duplicate groups; crops and other shots are never in one (an image with only those beside it
        # is shown as a group of one)
        assert sorted(m for m in members if len(m) > 1) == sorted(copies.values())

        # every thumbnail is shown (decoded, not a broken image)
        page.wait_for_function("[...document.querySelectorAll('#groups .card img')].every(i => i.complete && "
                               "i.naturalWidth > 0)", timeout=60_000)
        # the relation of each image to the kept one, in words
        cat, edited, crop = ids["cat.jpg"], ids["cat-edited.jpg"], ids["cat-crop.jpg"]
        assert _card(page, edited).locator(".rel").inner_text() == f"edited copy of #{cat}"
        assert _card(page, cat).locator(".rel").inner_text() == "suggested to keep"  # the larger one
        twins = [ids["astronaut.jpg"], ids["astronaut (copy).jpg"]]  # the same bytes: either may be kept
        notes = sorted(_card(page, i).locator(".rel").inner_text() for i in twins)
        assert notes in [[f"exact copy of #{t}", "suggested to keep"] for t in twins], notes
        assert _card(page, crop).locator(".rel").inner_text() == f"crop of #{cat}"  # beside the cat's group
        assert _card(page, crop).locator("xpath=..").get_attribute("class") == "strip related"
        shots = [ids["coffee-shot1.jpg"], ids["coffee-shot2.jpg"]]
        shot_notes = [_card(page, s).locator(".rel").inner_text() for s in shots]
        assert any(n.startswith("same scene of #") for n in shot_notes), shot_notes
        for other in ("skimage-rocket.jpg", "sklearn-china.jpg"):
            assert _card(page, ids[other]).count() == 0  # unrelated photos are not listed
        _screenshot(page.locator("main"), tmp_path / "duplicates.png")

        # side by side: the edited copy and the photo, each frame outlined where it lies in the other
        _card(page, edited).locator("button.cmp").click()
        page.wait_for_selector("#compare[open]")
        assert page.inner_text("#cmpWords").startswith(f"Images #{min(cat, edited)} and #{max(cat, edited)} are edited "
                                                       "copies of one photo")
        assert page.locator("#aSvg polygon").count() == 1 and page.locator("#bSvg polygon").count() == 1
        facts = page.inner_text("#cmpFacts")
        assert "matches agree on one homography" in facts and "MaxSim per token" in facts
        page.wait_for_function("document.getElementById('aImg').naturalWidth > 0 && "
                               "document.getElementById('bImg').naturalWidth > 0")
        page.click("#tokensBtn")  # the token explanation: a box per matched token on both images
        page.wait_for_function("document.querySelectorAll('#aSvg rect').length > 0")
        assert page.locator("#aSvg rect").count() == page.locator("#bSvg rect").count()
        _screenshot(page.locator("#compare"), tmp_path / "duplicates-compare.png")
        page.click("#cmpClose")

        # the crop's comparison names the containing image
        _card(page, crop).locator("button.cmp").click()
        page.wait_for_selector("#compare[open]")
        assert page.inner_text("#cmpWords").startswith(f"Image #{crop} is a crop of image #{cat} (it shows ")
        assert page.locator("#aSvg polygon").count() == 1  # where the crop lies in the photo, outlined
        page.wait_for_function("document.getElementById('aImg').naturalWidth > 0 && "
                               "document.getElementById('bImg').naturalWidth > 0")
        _screenshot(page.locator("#compare"), tmp_path / "duplicates-crop.png")
        page.click("#cmpClose")

        # keep this one: keeping the edited copy selects the photo for deletion
        _card(page, edited).locator("input.keep").check()
        assert page.inner_text("#selectionText") == "1 image selected for deletion"
        assert "marked" in _card(page, cat).get_attribute("class")
        assert "kept" in _card(page, edited).get_attribute("class")
        assert _card(page, edited).locator(".rel").inner_text() == "kept"
        assert _card(page, cat).locator(".rel").inner_text() == f"edited copy of #{edited}"
        # asked first; cancelling deletes nothing
        page.click("#deleteBtn")
        page.wait_for_selector("#confirm[open]")
        assert page.inner_text("#confirmTitle") == "Delete 1 image from the index?"
        assert f"#{cat} cat.jpg" in page.inner_text("#confirmList")
        page.click("#confirmNo")
        assert page.locator("#confirm[open]").count() == 0
        assert ids["cat.jpg"] in {im["id"] for im in _get(f"{url}/v1/images?limit=100", read_key)["images"]}
        # a read key cannot delete: the page says a write key is needed and the image stays
        page.click("#deleteBtn")
        page.click("#confirmYes")
        page.wait_for_selector("#error:not([hidden])")
        assert "write scope" in page.inner_text("#error")
        assert page.inner_text("#selectionText") == "1 image selected for deletion"
        # with a write key it is deleted, and the groups are found again on the next index version
        page.fill("#apiKey", write_key)
        page.dispatch_event("#apiKey", "change")
        page.wait_for_selector("#groups .group")
        _card(page, edited).locator("input.keep").check()
        page.click("#deleteBtn")
        page.click("#confirmYes")
        page.wait_for_function("document.getElementById('status').textContent.includes('1 image deleted')"
                               " || document.getElementById('status').textContent.includes('duplicate groups')",
                               timeout=120_000)
        wait_until(lambda: ids["cat.jpg"] not in {im["id"] for im in
                                                  _get(f"{url}/v1/images?limit=100", read_key)["images"]},
                   120, what="the kept copy's group to lose the deleted photo")
        page.wait_for_function("document.getElementById('status').textContent.includes('1 duplicate groups')",
                               timeout=180_000)
        assert _card(page, cat).count() == 0
        assert page.locator("#groups .group h2", has_text="copies").count() == 1  # the astronaut's group is left
    finally:
        page.close()


def test_a_late_explanation_is_dropped_and_a_failed_one_can_be_tried_again(browser, server, tmp_path):
    """The token matches of a pair whose explanation is still loading when another pair is opened are dropped (before:
    drawn on the other pair); a failed request says why in the comparison and leaves the button usable (before: the
    button stayed disabled and the error went to the page behind the dialog). The astronaut's group: two pairs,
    the grey copy and the byte copy each with the one kept (the group the first test of the module leaves)."""
    url, read_key, _, ids = server
    page = browser.new_page(viewport={"width": 1200, "height": 1100})
    explained = lambda u: "/duplicates?" in u and "explain=true" in u  # noqa: E731 (a pair's token explanation)
    try:
        page.goto(f"{url}/duplicates")
        page.wait_for_selector("#keyBox:not([hidden])")
        page.fill("#apiKey", read_key)
        page.dispatch_event("#apiKey", "change")
        grey = ids["astronaut-grey-small.jpg"]
        page.wait_for_selector(f'#groups .card[data-id="{grey}"] button.cmp', timeout=180_000)
        twin = next(i for i in (ids["astronaut.jpg"], ids["astronaut (copy).jpg"])
                    if _card(page, i).locator("button.cmp").count())  # the copy that is not kept

        def compare(image_id: int) -> None:
            _card(page, image_id).locator("button.cmp").click()
            page.wait_for_selector("#compare[open]")

        held = []  # the first explanation request, answered when the test says
        page.route(explained, lambda route: held.append(route) if not held else route.continue_())
        compare(grey)
        page.click("#tokensBtn")
        wait_until(lambda: held or page.wait_for_timeout(50), 30, what="the explanation request to be held")
        assert page.locator("#tokensBtn").is_disabled()
        page.click("#cmpClose")
        compare(twin)  # another pair while the first one's explanation is on its way
        with page.expect_response(lambda r: explained(r.url)) as late:
            held[0].continue_()
        late.value.finished()
        page.evaluate("new Promise(r => setTimeout(r, 500))")  # the page has had the answer in its hands
        assert page.locator("#aSvg rect").count() == 0 and page.locator("#bSvg rect").count() == 0
        assert page.locator("#tokensBtn").is_enabled() and page.locator("#cmpError").is_hidden()
        # then this pair's own token matches, where the API's explanation of this pair puts them
        page.click("#tokensBtn")
        page.wait_for_function("document.querySelectorAll('#aSvg rect').length > 0")
        a, b = (int(v) for v in re.match(r"#(\d+) and #(\d+):", page.inner_text("#cmpTitle")).groups())
        assert twin in (a, b) and grey not in (a, b)
        index = int(_card(page, twin).locator("xpath=ancestor::section").get_attribute("data-group"))
        query = "&".join(f"relation={r}" for r in ("exact", "edited_copy", "crop", "same_scene"))
        group = _get(f"{url}/v1/duplicates?offset={index}&limit=1&explain=true&{query}", read_key)["groups"][0]
        ex = next(p for p in group["pairs"] if (p["a"], p["b"]) == (a, b))["explanation"]
        boxed = [m for m in ex["a_to_b"]["matches"] if ex["a_tokens"][m["query_token"]]["box"] and m["result_box"]]
        drawn = page.evaluate("[...document.querySelectorAll('#aSvg rect')].map(r => "
                              "['x', 'y', 'width', 'height'].map(k => Number(r.getAttribute(k))))")
        assert drawn == [pytest.approx([x0, y0, x1 - x0, y1 - y0]) for x0, y0, x1, y1 in
                         (ex["a_tokens"][m["query_token"]]["box"] for m in boxed)]
        page.click("#cmpClose")
        page.unroute(explained)

        # a failed request: said in the comparison, and the button works again
        page.route(explained, lambda route: route.fulfill(
            status=503, json={"error": {"code": "index_unavailable", "message": "no index version yet"}}))
        compare(grey)
        page.click("#tokensBtn")
        page.wait_for_selector("#cmpError:not([hidden])")
        assert page.inner_text("#cmpError") == "The server has no index yet. (no index version yet)"
        assert page.locator("#tokensBtn").is_enabled()
        assert page.locator("#aSvg rect").count() == 0
        _screenshot(page.locator("#compare"), tmp_path / "duplicates-compare-error.png")
        page.unroute(explained)
        page.click("#tokensBtn")
        page.wait_for_function("document.querySelectorAll('#aSvg rect').length > 0")
        assert page.locator("#cmpError").is_hidden()
        _screenshot(page.locator("#compare"), tmp_path / "duplicates-compare-retried.png")
    finally:
        page.close()

@pytest.fixture(scope="module")
def server_two_framings(library, tmp_path_factory):
    """The service, no keys, over the library indexed as new CNN indexes are: the default backbone with two
    framings per image scored apart ("center-crop+aspect", framing score "best": 20 tokens, 10 per framing);
    yields (url, {file name: image id})."""
    from regis.models.config import TWO_FRAMINGS
    from regis.models.encoder import build_encoder
    from regis.models.registry import DEFAULT_BACKBONE
    from service.app import create_app
    from service.settings import Settings

    tmp = tmp_path_factory.mktemp("dup-page-2f")
    build(library, tmp / "index", build_encoder(DEFAULT_BACKBONE, frame=TWO_FRAMINGS, framing_score="best"))
    settings = Settings(index_dir=tmp / "index", images_root=library, index_poll_s=0.2, torch_threads=1)
    with ServerThread(create_app(settings)) as srv:
        ids = {im["path"]: im["id"] for im in _get(f"{srv.url}/v1/images?limit=100", "")["images"]}
        yield srv.url, ids


@pytest.mark.heavy  # its own two-framing index and self-join: 16 s here (load 7.6), 36 s run alone
def test_a_two_framing_comparison_draws_only_the_centre_crop_tokens(browser, server_two_framings, tmp_path):
    """On a two-framing index a pair is scored on each image's centre crop against all of the other's tokens
    (``regis.duplicates.report.explain_pair``: ``explanation.framing`` "crop", the whole image's query tokens do not
    score): the side-by-side comparison draws a box for the crop framing's tokens only, each where the explanation
    puts it (in either framing of the other image), and says so in words."""
    url, ids = server_two_framings
    cat, edited = ids["cat.jpg"], ids["cat-edited.jpg"]
    page = browser.new_page(viewport={"width": 1200, "height": 1100})
    try:
        page.goto(f"{url}/duplicates")
        page.wait_for_selector(f'#groups .card[data-id="{edited}"] button.cmp', timeout=180_000)
        index = int(_card(page, edited).locator("xpath=ancestor::section").get_attribute("data-group"))
        _card(page, edited).locator("button.cmp").click()
        page.wait_for_selector("#compare[open]")
        page.wait_for_function("document.getElementById('aImg').naturalWidth > 0 && "
                               "document.getElementById('bImg').naturalWidth > 0")
        page.click("#tokensBtn")
        page.wait_for_function("document.querySelectorAll('#aSvg rect').length > 0")

        # what the page was given: the pair's explanation, as the API answers it
        query = "&".join(f"relation={r}" for r in ("exact", "edited_copy", "crop", "same_scene"))
        group = _get(f"{url}/v1/duplicates?offset={index}&limit=1&explain=true&{query}", "")["groups"][0]
        pair = next(p for p in group["pairs"] + group["related"] if {p["a"], p["b"]} == {cat, edited})
        ex = pair["explanation"]
        assert ex["framing"] == "crop" and len(ex["a_tokens"]) == 20
        per = len(ex["a_tokens"]) // 2  # the crop framing's tokens: the first half
        boxed = [m for m in ex["a_to_b"]["matches"] if ex["a_tokens"][m["query_token"]]["box"] and m["result_box"]]
        crop = [m for m in boxed if m["query_token"] < per]
        assert crop and crop == boxed  # the crop framing's tokens alone are the queries

        def drawn(svg: str) -> list[float]:  # every drawn box's x, y, width, height, one after the other
            return page.evaluate(f"[...document.querySelectorAll('#{svg} rect')].flatMap(r => "
                                 "['x', 'y', 'width', 'height'].map(k => Number(r.getAttribute(k))))")

        def rects(boxes: list[list[float]]) -> list[float]:
            return [v for b in boxes for v in (b[0], b[1], b[2] - b[0], b[3] - b[1])]

        assert page.locator("#aSvg rect").count() == len(crop) == page.locator("#bSvg rect").count()
        assert drawn("aSvg") == pytest.approx(rects([ex["a_tokens"][m["query_token"]]["box"] for m in crop]))
        assert drawn("bSvg") == pytest.approx(rects([m["result_box"] for m in crop]))
        assert "compared on each image's centre crop" in page.inner_text("#cmpFraming")
        _screenshot(page.locator("#compare"), tmp_path / "duplicates-compare-two-framings.png")
    finally:
        page.close()
