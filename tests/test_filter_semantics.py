"""Filter semantics (issue 25, item 3): a field no image has is an error naming it and the nearest known fields
(HTTP 422, CLI exit 2) unless the filter says "strict": false; "contains" and "in" match the members of list-valued
metadata; a build of a folder without images says so and changes nothing."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from regis.errors import ConfigError
from regis.indexes.filters import UnknownFieldError, check_fields, compile_filter, filter_fields, filter_options
from regis.indexes.table import ImageRecord, ImageTable
from service.app import create_app
from service.settings import Settings
from tests.conftest import build

PEOPLE = [{"people": ["Eileen Collins", "Sally Ride"], "album": "nasa", "rank": [1, 2]},
          {"people": ["Grace Hopper"], "album": "navy", "flags": [True]},
          {"people": "Eileen Collins", "album": "nasa"},  # a single value, not a list
          {"people": [], "album": "empty", "tags": {"who": "ann"}},
          {"people": {"name": "Eileen Collins"}},  # an object: its members are not list members
          {}]


@pytest.fixture
def table(tmp_path):
    t = ImageTable(tmp_path / "t.sqlite", readonly=False)
    t.upsert([ImageRecord(i, f"f/{i}.jpg", "0" * 64, 10, 10, 100, 1.0, m) for i, m in enumerate(PEOPLE)])
    t.commit()
    yield t
    t.close()


@pytest.mark.parametrize("f, expected", [
    ({"people": {"contains": "Eileen Collins"}}, [0, 2]),
    ({"people": {"contains": ["Eileen Collins", "Sally Ride"]}}, [0]),  # every member
    ({"people": {"contains": "Sally"}}, []),  # members, not substrings
    ({"rank": {"contains": 2}}, [0]),
    ({"flags": {"contains": True}}, [1]),
    ({"people": {"in": ["Grace Hopper", "Sally Ride"]}}, [0, 1]),  # a member is one of them
    ({"people": {"in": ["Eileen Collins"]}}, [0, 2]),  # a single value equal to one of them too
    ({"album": {"in": ["nasa", "navy"]}}, [0, 1, 2]),  # scalars as before
    ({"not": {"people": {"contains": "Eileen Collins"}}}, [1, 3, 4, 5]),
    ({"id": {"in": [1, 3]}}, [1, 3]),
])
def test_contains_and_in_match_list_members_worked_out_by_hand(table, f, expected):
    sql, params = compile_filter(f)
    assert table.ids_where(sql, params).tolist() == expected


def test_contains_is_refused_on_columns_and_without_values():
    for bad in ({"path": {"contains": "x"}}, {"people": {"contains": []}}, {"people": {"contains": {"a": 1}}}):
        with pytest.raises(ConfigError):
            compile_filter(bad)


def test_unknown_fields_are_named_with_the_nearest_known_ones(table):
    with pytest.raises(UnknownFieldError) as info:
        check_fields(table, {"albun": "nasa", "people": {"contains": "x"}})
    assert info.value.fields == ["albun"] and info.value.suggestions[0] == "album"
    assert "'albun'" in str(info.value) and "album" in str(info.value) and '"strict": false' in str(info.value)
    with pytest.raises(UnknownFieldError) as info:  # inside and / or / not too; nested keys by their dotted name
        check_fields(table, {"or": [{"tags.whom": "ann"}, {"not": {"album": "x"}}]})
    assert info.value.fields == ["tags.whom"] and "tags.who" in info.value.suggestions
    check_fields(table, {"albun": "nasa", "strict": False})  # the caller asked for it
    check_fields(table, {"tags.who": "ann", "tags": {"exists": True}, "id": 3, "width": {"gt": 1}})
    assert table.field_names() >= {"people", "album", "rank", "flags", "tags", "tags.who", "people.name"}


def test_strict_is_an_option_not_a_field():
    assert filter_options({"a": 1, "strict": False}) == ({"a": 1}, False)
    assert filter_options({"strict": True}) == (None, True)
    assert filter_fields({"a": 1, "strict": False, "or": [{"b.c": 2}, {"id": 1}]}) == ["a", "b.c"]
    assert compile_filter({"a": 1, "strict": False}) == compile_filter({"a": 1})
    with pytest.raises(ConfigError):
        filter_options({"a": 1, "strict": "no"})


@pytest.fixture(scope="module")
def people_index(tmp_path_factory, photos_dir, tiny_encoder):
    """Four photos with list-valued metadata (sidecars), tiny random encoder."""
    folder = tmp_path_factory.mktemp("people")
    sidecars = {"skimage-astronaut.png": {"people": ["Eileen Collins", "Sally Ride"], "album": "nasa"},
                "matplotlib-grace_hopper.jpg": {"people": ["Grace Hopper"], "album": "navy"},
                "skimage-coffee.png": {"album": "kitchen"}, "skimage-chelsea.png": {}}
    for name, meta in sidecars.items():
        (folder / name).write_bytes((photos_dir / name).read_bytes())
        (folder / f"{name}.json").write_text(json.dumps(meta))
    index = tmp_path_factory.mktemp("people-index")
    build(folder, index, tiny_encoder)
    return folder, index


def test_the_api_answers_422_for_an_unknown_field_and_matches_list_members(people_index):
    folder, index = people_index
    query = (folder / "skimage-coffee.png").read_bytes()
    with TestClient(create_app(Settings(index_dir=index))) as client:
        def search(f):
            return client.post("/v1/search", params={"filter": json.dumps(f), "k": 10},
                               files={"file": ("q.png", query)})

        r = search({"albun": "nasa"})
        assert r.status_code == 422, r.text
        error = r.json()["error"]
        assert error["code"] == "unknown_filter_field" and error["fields"] == ["albun"]
        assert error["suggestions"][0] == "album" and "album" in error["message"]
        r = search({"albun": "nasa", "strict": False})
        assert r.status_code == 200 and r.json()["results"] == []
        hits = search({"people": {"contains": "Sally Ride"}}).json()["results"]
        assert [h["path"] for h in hits] == ["skimage-astronaut.png"]
        hits = search({"people": {"in": ["Grace Hopper", "Sally Ride"]}}).json()["results"]
        assert sorted(h["path"] for h in hits) == ["matplotlib-grace_hopper.jpg", "skimage-astronaut.png"]
        r = client.get("/v1/images", params={"filter": "albun:nasa"})  # the listing too
        assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_filter_field"
        assert client.get("/v1/images", params={"filter": '{"strict": false}'}).json()["total"] == 4


def test_the_cli_refuses_an_unknown_field_and_an_empty_folder(people_index, tmp_path, cli):
    folder, index = people_index
    out = cli("search", index, folder / "skimage-coffee.png", "--filter", "albun:nasa")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[0].startswith("error: no image has the filter field 'albun'")
    assert "nearest known fields: album" in out.stderr
    out = cli("search", index, folder / "skimage-coffee.png", "--filter", "people:x,strict:false", "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["results"] == []
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    (empty / "notes.txt").write_text("not an image")
    before = sorted(p.name for p in (index / "versions").iterdir())
    out = cli("index", "build", empty, "--index", index)
    assert out.returncode == 1 and f"error: no images found under {empty}" in out.stderr
    assert len(out.stderr.strip().splitlines()) <= 2
    assert sorted(p.name for p in (index / "versions").iterdir()) == before
