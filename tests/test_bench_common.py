"""``bench.common.dir_bytes``, the one disk-size measure of the benchmarks (bench.capacity, bench.index_size,
bench.million, bench.peers): each file once, as ``du``; the other shared helpers; ``timed_searches``' warm-up (on
a fake clock: no benchmark is timed here)."""

from __future__ import annotations

import os

from bench.common import dir_bytes


def test_dir_bytes_counts_each_file_once(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 1000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"y" * 24)
    os.link(tmp_path / "a", tmp_path / "sub" / "a-again")  # one file, two names (as backups link segments)
    (tmp_path / "link").symlink_to(tmp_path / "a")  # not followed
    (tmp_path / "sub-link").symlink_to(tmp_path / "sub", target_is_directory=True)
    assert dir_bytes(tmp_path) == 1024
    assert dir_bytes(tmp_path / "a") == 1000
    assert dir_bytes(tmp_path / "empty-missing") == 0


def test_print_json_prints_and_writes_the_same_text(tmp_path, capsys):
    import numpy as np

    from bench.common import print_json

    out = {"pairs": 3, "score": np.float32(0.5)}
    text = print_json(out, tmp_path / "new" / "r.json")
    assert (tmp_path / "new" / "r.json").read_text() == text + "\n" == capsys.readouterr().out
    assert '"score": 0.5' in text
    print_json(out)  # no path: printed only
    assert capsys.readouterr().out == text + "\n"


def test_rss_growth_is_per_image_and_splits_anon_and_file():
    from bench.common import proc_memory, rss_growth

    base = {"VmRSS": 1000, "RssAnon": 600, "RssFile": 400}
    now = {"VmRSS": 1000 + 3 * 2**20, "RssAnon": 600 + 2 * 2**20, "RssFile": 400 + 2**20}
    out = rss_growth(base, now, n=2**10)
    assert out["rss_bytes_per_image"] == 3 * 2**10
    assert out["rss_anon_bytes_per_image"] == 2 * 2**10 and out["rss_file_bytes_per_image"] == 2**10
    assert out["rss_total_mib"] == now["VmRSS"] / 2**20
    snap = proc_memory()  # the real /proc/self/status fields it reads
    assert set(snap) >= {"VmRSS", "RssAnon", "RssFile"} and snap["VmRSS"] > 0


class _ColdSearcher:
    """A stand-in ``Searcher`` on a fake clock: its first ``cold`` calls take 1 s each, the rest 1 ms; it records
    the queries it was asked (their first value is the query's number) and answers query i with ids [i]."""

    def __init__(self, clock: list[float], cold: int):
        self.clock, self.cold, self.asked = clock, cold, []

    def search(self, query, k, depth=None, nprobe=None):
        from types import SimpleNamespace

        import numpy as np

        self.clock[0] += 1.0 if len(self.asked) < self.cold else 1e-3
        self.asked.append(int(query[0, 0]))
        return SimpleNamespace(ids=np.array([int(query[0, 0])]), num_candidates=7)

    def search_batch(self, queries, k, depth=None, nprobe=None):
        return [self.search(q, k, depth, nprobe) for q in queries]


def _fake_clock(monkeypatch) -> list[float]:
    """``time.perf_counter`` (what bench.common and bench.search time with) reads ``clock[0]``, seconds."""
    clock = [0.0]
    monkeypatch.setattr("time.perf_counter", lambda: clock[0])
    return clock


def test_warm_up_queries_are_not_timed(monkeypatch):
    """``timed_searches(warmup=n)``: n untimed searches first (the first queries, cycling), then one timed search
    per query; the slow cold calls are in no latency."""
    import numpy as np
    import pytest

    from bench.common import timed_searches, warm_up

    clock = _fake_clock(monkeypatch)
    q = np.arange(5, dtype=np.float32)[:, None, None] * np.ones((5, 2, 4), np.float32)
    searcher = _ColdSearcher(clock, cold=7)
    lat, found, cands = timed_searches(searcher, q, k=2, warmup=7)
    assert searcher.asked == [0, 1, 2, 3, 4, 0, 1] + [0, 1, 2, 3, 4]
    assert lat == pytest.approx([1e-3] * 5) and cands == [7] * 5
    assert found.tolist() == [[i, -1] for i in range(5)]
    cold = _ColdSearcher(clock, cold=1)  # warmup 0 (the default): a cold measure stays cold
    assert timed_searches(cold, q[:2], k=1)[0] == pytest.approx([1.0, 1e-3]) and cold.asked == [0, 1]
    with pytest.raises(ValueError, match="must be >= 0"):
        warm_up(cold, q, -1, k=1)
    with pytest.raises(ValueError, match="no queries"):
        warm_up(cold, q[:0], 1, k=1)


def test_search_bench_point_records_its_warm_up(monkeypatch):
    """``bench.search.run_point``: p50 / p99 over the timed queries only, the warm-up count in the row; with
    ``single=False`` the warm-up still runs before the batched QPS."""
    import numpy as np
    import pytest

    from bench.search import run_point

    clock = _fake_clock(monkeypatch)
    q = np.arange(20, dtype=np.float32)[:, None, None] * np.ones((20, 2, 4), np.float32)
    gt = np.arange(20)[:, None].repeat(2, axis=1)
    searcher = _ColdSearcher(clock, cold=3)
    row = run_point(searcher, q, gt, k=1, depth=None, nprobe=None, batch=5, warmup=3)
    assert row["warmup_queries"] == 3 and len(searcher.asked) == 3 + 20 + 20
    assert row["p99_ms"] == pytest.approx(1.0) and row["single_qps"] == pytest.approx(1000)
    assert row["recall@10"] == 1.0
    searcher = _ColdSearcher(clock, cold=3)
    row = run_point(searcher, q, gt, k=1, depth=None, nprobe=None, batch=20, single=False, warmup=3)
    assert row["warmup_queries"] == 3 and searcher.asked[:3] == [0, 1, 2] and len(searcher.asked) == 23
    assert row["batched_qps"] == pytest.approx(1000)
    cold = run_point(_ColdSearcher(clock, cold=3), q, gt, k=1, depth=None, nprobe=None, batch=5, warmup=0)
    assert cold["warmup_queries"] == 0 and cold["p99_ms"] > 900  # the cold calls are timed without a warm-up
