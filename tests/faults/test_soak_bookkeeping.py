"""The soak script's chaos and bookkeeping (scripts/soak.py, issue 27): its poisoned values are ones regis must
refuse, its good filters ones it must answer, and its ledger classifies answers as the figures in docs/DEPLOY.md
say (a 5xx is explained only by a process that was down or a collection without a version; a poisoned value
answered 2xx is unexpected; a transport error counts against the API only when it was up all along). No server:
the ledger is fed answers by hand. A few seconds."""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from pathlib import Path

import pytest

from regis.errors import ConfigError
from regis.indexes.filters import compile_filter, filter_options, parse_filter
from regis.indexes.json_values import InvalidValueError, loads

_PATH = Path(__file__).resolve().parents[2] / "scripts" / "soak.py"


@pytest.fixture(scope="module")
def soak():
    spec = importlib.util.spec_from_file_location("soak_under_test", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclass looks its module up)
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def _metadata_refused(body: bytes) -> bool:
    """Whether the service's checks refuse ``body`` as metadata (bytes that are not UTF-8: the form parser's
    UTF-8 check, service.limits; the rest: regis.indexes.json_values, which PATCH and uploads use)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return True
    try:
        loads(text, "metadata", max_bytes=64 * 1024)
    except InvalidValueError:
        return True
    return False


def _filter_refused(text: str) -> bool:
    try:
        where = parse_filter(text)
        if where is not None and filter_options(where)[0] is not None:
            compile_filter(where)
    except ConfigError:
        return True
    return False


def test_the_poisoned_values_are_the_audits_and_regis_refuses_each(soak):
    poisons = dict(soak.poisoned_metadata())
    assert {"nan", "infinity", "-infinity", "surrogate", "surrogate-key", "surrogate-raw", "nesting-600",
            "int-2^64", "int-below-int64"} <= set(poisons)
    assert poisons["nesting-600"].count(b"{") == 601  # item 1: ~600 levels
    assert b"\xed\xa0\x80" in poisons["surrogate-raw"]  # U+D800 as raw bytes: not UTF-8
    assert [name for name, body in poisons.items() if not _metadata_refused(body)] == []
    assert not _metadata_refused(b'{"tag": 3}')  # what the good PATCHes send


def test_the_bad_filters_are_refused_and_the_good_ones_compile(soak):
    bad = dict(soak.bad_filters())
    assert {"int-2^64", "int-2^64-short", "surrogate", "nesting-3000"} <= set(bad)
    assert len(bad["nesting-3000"]) < 8192  # fits the query parameter's limit: the parser must refuse it
    assert [name for name, text in bad.items() if not _filter_refused(text)] == []
    assert [f for f in soak.GOOD_FILTERS + soak.CHAOS_FILTERS if _filter_refused(f)] == []


def test_a_5xx_is_explained_only_by_a_process_down(soak):
    ledger = soak.Ledger()
    up = ledger.window()
    ledger.record("search", 200, None, up)
    ledger.record("upload", 503, "queue_unavailable", up)  # Redis was up all along: a defect
    ledger.record("upload", 500, "collection_not_found", up)
    ledger.record("chaos-search", 503, "index_unavailable", up)  # an empty collection answers 200: a defect
    ledger.set_down("redis", True)
    during = ledger.window()
    ledger.record("upload", 503, "queue_unavailable", during)
    ledger.record("upload", 503, "index_unavailable", during)  # Redis down does not explain this one
    before_kill = ledger.window()
    ledger.set_down("redis", False)
    ledger.record("delete", 503, "queue_unavailable", before_kill)  # Redis restarted during the request
    assert ledger.fivexx == {
        "upload 503 queue_unavailable (while up)": 1, "upload 500 collection_not_found (while up)": 1,
        "chaos-search 503 index_unavailable (while up)": 1,
        "upload 503 queue_unavailable (redis down)": 1, "upload 503 index_unavailable (while up)": 1,
        "delete 503 queue_unavailable (redis down)": 1}
    assert ledger.http_5xx_while_up() == 4
    assert ledger.outcomes["upload 503"] == 3 and ledger.outcomes["search 200"] == 1


def test_answers_outside_a_kinds_expected_set_are_unexpected(soak):
    ledger = soak.Ledger()
    up = ledger.window()
    for kind, status in [("meta-poison-patch", 422), ("meta-poison-upload", 422), ("bad-filter-list", 422),
                         ("filter-list", 200), ("chaos-upload", 404), ("coll-delete", 204)]:
        ledger.record(kind, status, None, up)
    assert ledger.unexpected == {}
    ledger.record("meta-poison-upload", 201, None, up)  # a poisoned value taken
    ledger.record("filter-list", 422, "unknown_filter_field", up)  # a good filter refused
    ledger.record("bad-filter-search", 200, None, up)
    assert ledger.unexpected == {"meta-poison-upload 201 None": 1, "filter-list 422 unknown_filter_field": 1,
                                 "bad-filter-search 200 None": 1}


def test_a_transport_error_counts_against_the_api_only_when_it_was_up_all_along(soak):
    ledger = soak.Ledger()
    before = ledger.window()
    ledger.record_transport("search", ConnectionResetError(), before)
    ledger.set_down("api", True)
    killed = ledger.window()
    ledger.record_transport("search", ConnectionRefusedError(), killed)
    ledger.set_down("api", False)
    ledger.record_transport("search", ConnectionResetError(), before)  # the API was killed meanwhile
    ledger.set_down("worker", True)
    ledger.record_transport("upload", TimeoutError(), ledger.window())  # only the worker is down
    assert ledger.dropped_while_api_up == 2
    assert ledger.outcomes == {"search ConnectionResetError": 1, "search ConnectionRefusedError (API down)": 1,
                               "search ConnectionResetError (API down)": 1, "upload TimeoutError": 1}


def test_a_run_fails_on_any_loss_leftover_resurrection_or_unexplained_5xx(soak):
    passing = {k: 0 for k in ["lost", "metadata_lost", "duplicated", "deleted_but_present", "orphaned_files",
                              "orphaned_staging", "orphaned_thumbnails", "http_5xx_while_up", "http_500",
                              "dropped_while_api_up", "resurrections"]}
    passing.update(unexpected={}, accepted_while_deleted={}, collections_root_leftovers=[], clients_stuck_at_end=[],
                   chaos_back_at_end=False, settled=True)
    assert soak.failures(passing) == []
    for key, bad in [("lost", 1), ("orphaned_files", 2), ("resurrections", 1), ("http_5xx_while_up", 1),
                     ("accepted_while_deleted", {"chaos-upload": 1}), ("collections_root_leftovers", [".deleted-x"]),
                     ("chaos_back_at_end", True), ("settled", False), ("clients_stuck_at_end", ["meta"])]:
        assert soak.failures({**passing, key: bad}) == [key]


def test_seeds_are_unique_across_threads(soak):
    """Two threads drawing seeds at once: all distinct, and neither hangs (a generator yielding inside its lock
    hung both)."""
    seeds, drawn = soak.Seeds(), [[], []]

    def draw(out):
        for _ in range(2000):
            out.append(next(seeds))

    threads = [threading.Thread(target=draw, args=(out,)) for out in drawn]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    assert sorted(drawn[0] + drawn[1]) == list(range(4000))


def test_disk_bytes_count_a_hard_linked_file_once(soak, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_bytes(b"x" * 100_000)
    os.link(tmp_path / "a" / "f", tmp_path / "g")  # an upload placed by a hard link, its staged file kept
    one = soak.disk_bytes([tmp_path / "a"])
    assert one >= 100_000 and soak.disk_bytes([tmp_path]) == one


def _acknowledged(ledger, *ids: int) -> dict[int, str]:
    """Uploads answered 201 (sha256 stand-ins); returns id -> sha."""
    shas = {i: f"sha-{i}" for i in ids}
    ledger.present.update({sha: i for i, sha in shas.items()})
    return shas


def _delete(ledger, image_id: int, status: int | None, body: dict | None = None) -> None:
    """One delete as ``Client.step_delete`` sends it; ``status`` None: no answer (a transport error)."""
    earlier = ledger.delete_sent(image_id)
    if status is not None and status < 500:
        ledger.delete_answered(image_id, status, body or {}, earlier)


def _final(ledger, shas: dict[int, str], live: set[int]) -> dict:
    import collections

    return ledger.losses(collections.Counter(shas[i] for i in live), live)


def test_a_delete_that_ran_without_an_answer_is_not_counted_lost_once_or_twice(soak):
    """Image 62 of the Redis run (docs/DEPLOY.md): a delete got no usable answer but its job ran; the next
    delete's job found it gone (200 deleted: false), a third answered 404. It was counted lost twice (an
    acknowledged upload not live, and a delete answered 404); it is no loss."""
    ledger = soak.Ledger()
    shas = _acknowledged(ledger, 62, 63)
    _delete(ledger, 62, None)  # its job ran; the answer was lost with the API
    _delete(ledger, 62, 200, {"deleted": False})
    assert (62, "sha-62") not in [(i, s) for s, i in ledger.deletable()]  # not picked again
    _delete(ledger, 62, 404)
    _delete(ledger, 63, 503)  # a delete that got a 5xx, then nothing more
    assert _final(ledger, shas, live=set()) == {"lost": [], "deleted_but_present": [],
                                                "gone_after_unanswered_delete": [63]}
    assert _final(ledger, shas, live={62, 63})["deleted_but_present"] == [62]  # its job proved it gone


def test_a_404_from_a_version_before_the_uploads_job_is_no_loss(soak):
    """Image 86 of the Redis run: its upload's job was seen done, but the API still served the version before
    it, so a delete answered 404; the image is live at the end. Not lost, not deleted."""
    ledger = soak.Ledger()
    shas = _acknowledged(ledger, 86)
    _delete(ledger, 86, 404)
    assert _final(ledger, shas, live={86}) == {"lost": [], "deleted_but_present": [],
                                               "gone_after_unanswered_delete": []}


def test_the_losses_that_are_real_are_counted_once_each(soak):
    ledger = soak.Ledger()
    shas = _acknowledged(ledger, 1, 2, 3, 4, 5, 6)
    _delete(ledger, 2, 404)  # no earlier delete, not live at the end: lost
    _delete(ledger, 3, 200, {"deleted": False})  # its job found it gone, no delete before: lost
    _delete(ledger, 4, 200, {"deleted": True})  # acknowledged, but live at the end
    _delete(ledger, 5, 202, {"job_id": "j5"})  # its job is read back at the end: it deleted 5
    ledger.delete_answered(5, 200, {"deleted": True}, ledger.delete_jobs["j5"][1])
    _delete(ledger, 6, 200, {"deleted": True})
    _delete(ledger, 6, 404)  # a later 404 of a deleted image changes nothing
    judged = _final(ledger, shas, live={4})  # 1 never deleted and not live: lost
    assert judged == {"lost": [1, 2, 3], "deleted_but_present": [4], "gone_after_unanswered_delete": []}


def test_a_definite_answer_does_not_erase_an_earlier_unanswered_delete(soak):
    ledger = soak.Ledger()
    shas = _acknowledged(ledger, 7, 8)
    _delete(ledger, 7, None)
    _delete(ledger, 7, 404)  # the earlier delete may have run, or the API lags: the end judges
    _delete(ledger, 8, 202, {"job_id": "j8"})  # its job never finished: it may still run
    assert _final(ledger, shas, live=set()) == {"lost": [], "deleted_but_present": [],
                                                "gone_after_unanswered_delete": [7, 8]}
    assert _final(ledger, shas, live={7, 8}) == {"lost": [], "deleted_but_present": [],
                                                 "gone_after_unanswered_delete": []}


def test_with_the_job_records_an_unanswered_delete_excuses_only_what_a_delete_job_removed(soak):
    """Redis mode reads back which ids the run's finished delete jobs removed: an image not live whose only
    explanation is an unanswered delete is lost unless one of those jobs removed it."""
    ledger = soak.Ledger()
    shas = _acknowledged(ledger, 11, 12)
    _delete(ledger, 11, None)
    _delete(ledger, 12, 503)
    assert _final(ledger, shas, live=set()) == {"lost": [], "deleted_but_present": [],
                                                "gone_after_unanswered_delete": [11, 12]}  # not checked
    import collections

    judged = ledger.losses(collections.Counter(), set(), removed_by_jobs={11})
    assert judged == {"lost": [12], "deleted_but_present": [], "gone_after_unanswered_delete": [11]}
