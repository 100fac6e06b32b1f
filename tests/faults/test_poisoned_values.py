"""Metadata and filter values the store or SQLite cannot handle (issue 27, items 1, 2, 3, 8 and 13): each is
refused with 422 naming the bad value's path, before anything is written; nothing answers 500. A hypothesis
property test writes random JSON through PATCH and then filters: 200 or 422, never 500.

Each test here failed on the code before the fix: deep metadata answered 500 and killed the job thread (every
later write stayed "queued"), NaN was stored and broke every filter, a lone surrogate was stored and broke every
response naming the image, filters with 2^64 or a surrogate or 3,000 nested arrays answered 500,
``score_threshold=nan`` returned nothing with 200, and ``POST /v1/explain`` read the form field ``id=1.0`` as 1."""

from __future__ import annotations

import io
import json

import pytest
from deploy.support import TINY
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from regis.indexes.json_values import MAX_DEPTH, check_value, loads, nesting
from regis.indexes.uploads import STAGING_DIR
from service.app import create_app
from service.settings import Settings


def _png(color: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), color).save(buf, format="PNG")
    return buf.getvalue()


def _nested(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("poisoned")
    (tmp / "images").mkdir()
    settings = Settings(index_dir=tmp / "index", images_root=tmp / "images", enable_jobs=True, write_wait_s=20,
                        **TINY)
    with TestClient(create_app(settings)) as c:
        r = c.post("/v1/images", files=[("files", ("a.png", _png("red"))), ("files", ("b.png", _png("blue")))])
        assert r.status_code == 201, r.text
        c.ids = [im["id"] for im in r.json()["images"]]
        c.staging = tmp / "images" / ".uploads" / STAGING_DIR
        yield c


def _patch_raw(client, image_id: int, body: str):
    return client.patch(f"/v1/images/{image_id}", content=body.encode("utf-8", "surrogatepass"),
                        headers={"content-type": "application/json"})


BAD_METADATA = [  # (JSON text of the metadata object, the path the 422 must name)
    ('{"n": NaN}', "metadata.n"),
    ('{"n": {"m": [1, Infinity]}}', "metadata.n.m[1]"),
    ('{"n": -Infinity}', "metadata.n"),
    ('{"s": "\\ud800"}', "metadata.s"),
    ('{"s": ["ok", "x\\udc00y"]}', "metadata.s[1]"),
    ('{"\\ud800": 1}', "metadata"),
    ('{"big": 18446744073709551616}', "metadata.big"),
    ('{"neg": -9223372036854775809}', "metadata.neg"),
    (json.dumps({"d": _nested(600)}), "metadata.d" + ".a" * 31),  # item 1: ~600 levels, a few KB
    (json.dumps(_nested(MAX_DEPTH + 1)), "metadata" + ".a" * 32),  # one level past the limit
]


@pytest.mark.parametrize("text, path", BAD_METADATA, ids=[p for _, p in BAD_METADATA])
def test_metadata_regis_cannot_store_is_refused_with_its_path_and_nothing_is_written(client, text, path):
    target = client.ids[0]
    before = client.get(f"/v1/images/{target}").json()
    r = _patch_raw(client, target, '{"metadata": ' + text + "}")
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_metadata" and error["path"].startswith(path[:200]), error
    after = client.get(f"/v1/images/{target}")
    assert after.status_code == 200 and after.json() == before  # no new version, the row untouched
    assert client.get("/v1/images", params={"filter": '{"n": {"gt": 1}, "strict": false}'}).status_code == 200
    r = client.patch(f"/v1/images/{target}", json={"metadata": {"n": 2}})  # the job thread still takes writes
    assert r.status_code == 200 and r.json()["metadata"]["n"] == 2, r.text
    client.patch(f"/v1/images/{target}", json={"metadata": {"n": None}})


def test_the_largest_values_regis_stores_are_taken_and_read_back(client):
    target = client.ids[1]
    value = {"big": 2**63 - 1, "neg": -(2**63), "f": 1e308, "deep": _nested(MAX_DEPTH - 1), "s": "\U0001f600 é"}
    r = client.patch(f"/v1/images/{target}", json={"metadata": value})
    assert r.status_code == 200, r.text
    got = client.get(f"/v1/images/{target}").json()["metadata"]
    assert {k: got[k] for k in value} == value
    for f in ('{"big": 9223372036854775807}', '{"neg": {"lt": 0}}', '{"s": "\U0001f600 é"}'):
        listed = client.get("/v1/images", params={"filter": f})
        assert listed.status_code == 200 and [im["id"] for im in listed.json()["images"]] == [target], f


@pytest.mark.parametrize("text, path", [('{"n": NaN}', "metadata.n"), ('[{"s": "\\ud800"}]', "metadata[0].s"),
                                        (json.dumps(_nested(600)), "metadata")])
def test_upload_metadata_regis_cannot_store_is_refused_before_anything_is_staged(client, text, path):
    before = client.get("/v1/images").json()["total"]
    r = client.post("/v1/images", files=[("files", ("c.png", _png("green")))],
                    data={"metadata": text.encode("utf-8", "surrogatepass")})
    assert r.status_code == 422 and r.json()["error"]["path"].startswith(path), r.text
    assert client.get("/v1/images").json()["total"] == before
    assert not client.staging.exists() or list(client.staging.iterdir()) == []


@pytest.mark.parametrize("raw", ['{"s": "x\ud800y"}'.encode("utf-8", "surrogatepass"),
                                 '{"s": "caf\u00e9"}'.encode("latin-1")], ids=["raw-surrogate", "latin-1"])
def test_upload_metadata_that_is_not_utf8_is_refused_not_stored_as_other_characters(client, raw):
    """Found by scripts/soak.py: a lone surrogate sent as raw bytes (not UTF-8) in the upload's ``metadata``
    field was decoded as Latin-1 by the form parser and stored as other characters (201); a PATCH of the same
    bytes is a 422. Now refused while the form streams (422 ``invalid_form_text``), nothing staged."""
    before = client.get("/v1/images").json()["total"]
    r = client.post("/v1/images", files=[("files", ("d.png", _png("yellow")))], data={"metadata": raw})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_form_text", r.text
    assert "metadata" in r.json()["error"]["message"]
    assert client.get("/v1/images").json()["total"] == before
    assert not client.staging.exists() or list(client.staging.iterdir()) == []
    r = client.post("/v1/images", files=[("files", ("d.png", _png("yellow")))],
                    data={"metadata": '{"s": "caf\u00e9 \U0001f600"}'.encode()})  # UTF-8: taken as sent
    assert r.status_code == 201 and r.json()["images"][0]["status"] == "added", r.text
    assert client.get(f"/v1/images/{r.json()['images'][0]['id']}").json()["metadata"]["s"] == "caf\u00e9 \U0001f600"
    client.delete(f"/v1/images/{r.json()['images'][0]['id']}")


BAD_FILTERS = [
    ('{"id": 18446744073709551616}', "filter.id"),
    ("id:99999999999999999999", "filter.id"),
    ('{"year": {"gte": 1e400}}', "filter.year.gte"),  # parses as Infinity
    ('{"s": "\\udc00"}', "filter.s"),
    ('{"s": {"in": ["a", "\\ud800"]}}', "filter.s"),
    ('s:"\\ud800"', "filter.s"),
    ('{"a": ' + "[" * 3000 + "]" * 3000 + "}", "filter"),  # ~6 KB: fits the 8,192-character limit
]


@pytest.mark.parametrize("text, path", BAD_FILTERS, ids=[p for _, p in BAD_FILTERS])
def test_filters_with_values_sqlite_cannot_take_are_422_and_the_connection_lives(client, text, path):
    for route in ("/v1/images",):
        r = client.get(route, params={"filter": text})
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_filter", r.text
        assert path in r.json()["error"]["message"], r.text
    r = client.post("/v1/search", params={"filter": text}, files={"file": ("q.png", _png("red"))})
    assert r.status_code == 422, r.text
    assert client.get("/v1/images").status_code == 200


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "Infinity"])
def test_a_score_threshold_that_is_not_a_finite_number_is_422(client, value):
    r = client.post("/v1/search", params={"score_threshold": value}, files={"file": ("q.png", _png("red"))})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text


@pytest.mark.parametrize("raw", ["1.0", "1e0", "+1", " 1", "0x1"])
def test_explain_refuses_an_id_that_is_not_plain_digits(client, raw):
    r = client.post("/v1/explain", data={"id": raw}, files={"file": ("q.png", _png("red"))})
    assert r.status_code == 422, r.text
    assert client.post("/v1/explain", data={"id": str(client.ids[1])},
                       files={"file": ("q.png", _png("red"))}).status_code == 200


def test_the_value_checks_by_hand():
    assert nesting('{"a": "[[[[", "b": [{}]}') == 3  # brackets inside strings do not count
    assert nesting('"\\"[["') == 0
    assert check_value({"a": [1, 2.5, None, True, "x"]}) == {"a": [1, 2.5, None, True, "x"]}
    with pytest.raises(ValueError, match=r"\$\[\"a b\"\]\[0\]: numbers must be finite"):
        check_value({"a b": [float("nan")]})
    with pytest.raises(ValueError, match="larger than 10 bytes"):
        check_value({"abcdefgh": 1}, max_bytes=10)
    with pytest.raises(ValueError, match="nested deeper than 32 levels"):
        loads("[" * 5000 + "]" * 5000)  # refused before json.loads would recurse
    with pytest.raises(ValueError, match="not valid JSON"):
        loads('{"a": ')


# ---------------------------------------------------------------- property: PATCH anything, then filter
_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8)
            | st.sampled_from(["\ud800", "a\udfffb", "\x00"]))
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=5) | st.sampled_from(["\udc00", "n", "s"]), inner, max_size=3), max_leaves=12)
_deep = st.integers(min_value=30, max_value=40).map(lambda n: _nested(n))
_filter_values = _scalars | st.dictionaries(st.sampled_from(["eq", "ne", "gt", "gte", "lt", "lte", "in"]),
                                            _scalars | st.lists(_scalars, min_size=1, max_size=3),
                                            min_size=1, max_size=2)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(patch=st.dictionaries(st.sampled_from(["n", "s", "m", "x"]), _json | _deep, min_size=1, max_size=3),
       field=st.sampled_from(["n", "s", "m", "m.n", "x"]), condition=_filter_values)
def test_any_json_through_patch_then_any_filter_is_200_or_422_never_500(client, patch, field, condition):
    target = client.ids[0]
    body = json.dumps({"metadata": patch}, ensure_ascii=True)  # NaN / Infinity / lone surrogates as JSON writes them
    r = _patch_raw(client, target, body)
    assert r.status_code in (200, 422), r.text
    for params in ({"filter": json.dumps({field: condition})}, {"filter": f"{field}:{json.dumps(condition)}"}):
        listed = client.get("/v1/images", params=params)
        assert listed.status_code in (200, 422), (params, listed.text)
    got = client.get(f"/v1/images/{target}")
    assert got.status_code == 200
    json.dumps(got.json(), allow_nan=False).encode("utf-8")  # what was stored is readable JSON


def test_the_embedded_job_thread_outlives_a_job_whose_end_cannot_be_recorded():
    """Item 1's second half: a job whose result cannot be copied (recorded) used to end the queue's one thread,
    and every later job stayed "queued"; now that job fails and the next one runs."""
    from regis.jobs.model import JobSpec
    from regis.jobs.queue import LocalJobQueue, wait_for

    results = iter([{"deep": _nested(5000)}, {"version": 7}])
    queue = LocalJobQueue(lambda spec, report: next(results))
    try:
        first = queue.submit(JobSpec(kind="delete", ids=[1])).id
        second = queue.submit(JobSpec(kind="delete", ids=[2])).id
        assert wait_for(queue, second, 10).state == "done"
        info = queue.get(first)
        assert info.state == "failed" and info.error.code == "internal"
    finally:
        queue.close()


def test_build_metadata_files_and_sidecars_are_checked_the_same_way(tmp_path):
    """A build's metadata (CSV, JSONL, sidecars) goes through the same check: a sidecar or JSONL row with NaN or
    a lone surrogate is refused naming the file and the value's path; CSV cells that are not storable numbers
    ("NaN", a 20-digit barcode) stay text."""
    from indexer.metadata import load_metadata_file, read_sidecar
    from regis.errors import ConfigError

    image = tmp_path / "a.jpg"
    (tmp_path / "a.jpg.json").write_text('{"exposure": {"ev": NaN}}')
    with pytest.raises(ConfigError, match=r"a\.jpg\.json: metadata\.exposure\.ev: numbers must be finite"):
        read_sidecar(image)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"path": "a.jpg", "ok": 1}\n{"path": "b.jpg", "s": "\\ud800"}\n')
    with pytest.raises(ConfigError, match=r"rows\.jsonl:2: metadata\.s: strings must be valid Unicode"):
        load_metadata_file(rows)
    table = tmp_path / "rows.csv"
    table.write_text("path,n,code,x\na.jpg,NaN,99999999999999999999,1.5\n")
    assert load_metadata_file(table) == {"a.jpg": {"n": "NaN", "code": "99999999999999999999", "x": 1.5}}
