"""``bench.common.dir_bytes``, the one disk-size measure of the benchmarks (bench.capacity, bench.index_size,
bench.million, bench.peers): each file once, as ``du``."""

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
