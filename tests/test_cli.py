"""The command line as a user runs it: `python -m regis ...` in a subprocess (the index build and the help
texts), and the other commands in-process through the same entry point (the ``cli`` fixture)."""

import json
import os
import subprocess
import sys

import pytest


def regis(*args, check=True, env_extra=None):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env_extra or {})}
    out = subprocess.run([sys.executable, "-m", "regis", *map(str, args)], capture_output=True, text=True, env=env,
                         timeout=300)
    if check and out.returncode != 0:
        raise AssertionError(f"regis {args} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return out


@pytest.fixture(scope="module")
def cli_index(tmp_path_factory, photos_dir):
    index = tmp_path_factory.mktemp("cli") / "index"
    out = regis("index", "build", photos_dir, "--index", index, "--backbone", "vit-tiny-reg4-test", "--random-init",
                "--no-progress", "--json")
    report = json.loads(out.stdout)
    assert report["added"] == 21 and report["version"] == 1
    return index


def test_rebuild_reuses_the_index_encoder_and_changes_nothing(cli_index, photos_dir, cli):
    out = cli("index", "build", photos_dir, "--index", cli_index, "--no-progress")
    assert out.stdout.startswith("index up to date: 21 images, nothing new to embed (0 added, 0 updated, 0 deleted)")
    assert "version" not in out.stdout and "images/s" not in out.stdout  # no new version


def test_build_summary_prints_a_rate_only_over_embedded_images(photos_dir, tmp_path, cli):
    import shutil

    folder, index = tmp_path / "photos", tmp_path / "index"
    folder.mkdir()
    for name in ("skimage-coffee.png", "skimage-chelsea.png", "skimage-rocket.jpg"):
        shutil.copy(photos_dir / name, folder / name)
    build = ("index", "build", folder, "--index", index, "--backbone", "vit-tiny-reg4-test", "--random-init",
             "--no-progress")
    first = cli(*build).stdout
    assert first.startswith("3 files scanned: 3 added, 0 updated, 0 deleted, 0 unchanged, 0 skipped; version 1; ")
    assert first.rstrip().endswith(" images/s embedding)")
    again = cli(*build).stdout  # the second run of `make demo`: every photo already indexed
    assert again.startswith("index up to date: 3 images, nothing new to embed (0 added, 0 updated, 0 deleted); "
                            "checked in ")
    assert "images/s" not in again
    (folder / "skimage-rocket.jpg").unlink()
    deleted = cli(*build).stdout  # only a deletion: a new version, nothing embedded
    assert deleted.startswith("2 files scanned: 0 added, 0 updated, 1 deleted, 2 unchanged, 0 skipped; version 2; ")
    assert deleted.rstrip().endswith(" s (nothing to embed)") and "images/s" not in deleted


def test_build_summary_of_a_resumed_build_has_no_rate():
    from cli.index import build_summary
    from indexer.build import BuildReport

    # every added image came from the interrupted run's staging area: none embedded now, so no rate
    report = BuildReport(images_root="p", index_dir="i", version=3, scanned=2, added=2, resumed=2, embed_s=0.2,
                         total_s=0.4)
    assert build_summary(report) == ("2 files scanned: 2 added, 0 updated (2 embedded by the interrupted run), "
                                     "0 deleted, 0 unchanged, 0 skipped; version 3; 0.4 s")
    report.embedded_now, report.images_per_s = 2, 10.0  # the normal case keeps its rate
    assert build_summary(report).endswith("; version 3; 0.4 s (10.0 images/s embedding)")


def test_search_prints_ranked_results(cli_index, photos_dir, cli):
    out = cli("search", cli_index, photos_dir / "skimage-coffee.png", "-k", "3")
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 3 and lines[0].split()[0] == "1" and lines[0].endswith("skimage-coffee.png")
    as_json = json.loads(cli("search", cli_index, photos_dir / "skimage-coffee.png", "--json", "--exact").stdout)
    assert as_json["mode"] == "exact" and as_json["results"][0]["path"] == "skimage-coffee.png"
    # the score of a perfect match: all 10 query tokens (a ViT: one framing, no cue tokens), said on stderr and in
    # the JSON; the indexed image queried with itself reaches it (float16 storage aside)
    assert as_json["max_score"] == 10.0 and "a perfect match scores 10;" in out.stderr
    assert as_json["results"][0]["score"] / as_json["max_score"] == pytest.approx(1.0, abs=1e-3)


def test_errors_name_the_file_and_exit_2_for_usage_1_for_failures(cli_index, tmp_path, cli):
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"nope")
    out = cli("search", cli_index, bad)  # the work failed: the file is not an image
    assert out.returncode == 1 and "broken.jpg" in out.stderr and "not an image" in out.stderr
    assert "Traceback" not in out.stderr
    out = cli("search", cli_index, tmp_path / "missing.png")
    assert out.returncode == 2 and "missing.png" in out.stderr
    out = cli("index", "build", tmp_path / "no-such-folder", "--index", tmp_path / "i")
    assert out.returncode == 2 and "no-such-folder" in out.stderr
    out = cli("index", "build", tmp_path, "--index", tmp_path / "i", "--roi-size", "4", "--random-init",
              "--backbone", "vit-tiny-reg4-test")
    assert out.returncode == 2 and "odd" in out.stderr


def test_info_and_backbones(cli_index, cli):
    manifest = json.loads(cli("index", "info", cli_index).stdout)
    assert manifest["encoder"]["backbone"] == "vit-tiny-reg4-test" and manifest["tokens_per_image"] == 10
    assert "efficientnet-lite0" in cli("backbones").stdout


def test_roi_image_size_option_is_recorded_and_refused_for_vits(photos_dir, tmp_path, cli):
    """`--roi-image-size 0` builds a one-pass CNN index (the manifest says so, a second build keeps it); the
    default CNN build reads ROI tokens from a 160 px pass; a ViT refuses the option, naming it."""
    two = tmp_path / "two"
    two.mkdir()
    for name in ("skimage-chelsea.png", "skimage-coffee.png"):
        (two / name).write_bytes((photos_dir / name).read_bytes())
    one_pass, default = tmp_path / "one-pass", tmp_path / "default"
    assert cli("index", "build", two, "--index", one_pass, "--backbone", "efficientnet-lite0", "--roi-image-size", "0",
               "--no-progress").returncode == 0
    assert cli("index", "build", two, "--index", default, "--backbone", "efficientnet-lite0",
               "--no-progress").returncode == 0
    info = {i: json.loads(cli("index", "info", i).stdout)["encoder"] for i in (one_pass, default)}
    assert info[one_pass]["roi_image_size"] is None and info[default]["roi_image_size"] == 160
    (two / "skimage-rocket.jpg").write_bytes((photos_dir / "skimage-rocket.jpg").read_bytes())
    assert cli("index", "build", two, "--index", one_pass, "--no-progress").returncode == 0  # its own encoder again
    assert json.loads(cli("index", "info", one_pass).stdout)["encoder"]["roi_image_size"] is None
    out = cli("index", "build", two, "--index", tmp_path / "vit", "--backbone", "vit-tiny-reg4-test",
              "--random-init", "--roi-image-size", "160")
    assert out.returncode == 2 and "roi_image_size" in out.stderr and "CNN" in out.stderr


def test_help_texts_keep_their_brackets():
    """Help is rendered as rich markup: an unescaped ``[ray]`` vanished from ``pip install 'regis[ray]'``."""
    for cmd in (("serve",), ("index", "build")):
        out = regis(*cmd, "--help", env_extra={"COLUMNS": "200"})
        assert "pip install 'regis[ray]'" in out.stdout, cmd


def test_index_build_records_the_k_factor_and_codec_and_refuses_bad_ones(photos_dir, tmp_path, cli):
    index = tmp_path / "kf"
    out = cli("index", "build", photos_dir, "--index", index, "--backbone", "vit-tiny-reg4-test", "--random-init",
              "--no-progress", "--token-store", "SQ4", "--k-factor", "2", "--faiss-codec", "SQ4")
    assert out.returncode == 0, out.stderr
    from regis.indexes.snapshot import IndexSnapshot

    snap = IndexSnapshot.open(index)
    assert snap.manifest.faiss.k_factor == 2 and snap.manifest.token_store.spec == "SQ4"
    assert (snap.manifest.faiss.spec, snap.manifest.faiss.codec) == ("Flat", "SQ4")  # 21 images: Flat, codec kept
    snap.close()
    found = json.loads(cli("search", index, photos_dir / "skimage-coffee.png", "--json").stdout)
    assert found["results"][0]["path"] == "skimage-coffee.png"  # neighbours re-ranked on the SQ4 codes
    out = cli("index", "build", photos_dir, "--index", tmp_path / "bad", "--k-factor", "0", "--random-init",
              "--backbone", "vit-tiny-reg4-test")
    assert out.returncode == 2 and "--k-factor" in out.stderr
    out = cli("index", "build", photos_dir, "--index", tmp_path / "compact", "--backbone", "vit-tiny-reg4-test",
              "--random-init", "--no-progress", "--compact")
    assert out.returncode == 0, out.stderr
    snap = IndexSnapshot.open(tmp_path / "compact")  # a 32-wide test ViT: 4 x 4-bit codes; 210 vectors: SQ4 store
    assert (snap.manifest.faiss.codec, snap.manifest.token_store.spec, snap.manifest.token_store.rule) == (
        "PQ4x4fsr", "SQ4", "compact")
    snap.close()
    out = cli("index", "build", photos_dir, "--index", tmp_path / "bad", "--faiss-codec", "Nonsense12", "--random-init",
              "--backbone", "vit-tiny-reg4-test")
    assert out.returncode == 2 and "Nonsense12" in out.stderr and "Traceback" not in out.stderr


def test_a_large_two_framing_build_gets_the_one_framing_hint():
    """The note of ``regis index build`` on a large index of two framings (BENCHMARKS.md section 9, run T): from
    ``LARGE_TWO_FRAMING`` images of two framings, never for one framing or a smaller index."""
    from cli.index import LARGE_TWO_FRAMING, framing_hint

    note = framing_hint(LARGE_TWO_FRAMING, 2)
    assert note is not None and "--frame center-crop" in note and f"{LARGE_TWO_FRAMING:,} images" in note
    assert framing_hint(LARGE_TWO_FRAMING - 1, 2) is None
    assert framing_hint(1_000_000, 1) is None
    # an SQ8 index is told of the 4-bit residual codes; one that has them is told nothing
    note = framing_hint(1_000_000, 2, "IVF65536(HNSW32_SQfp16),SQ8", 256)
    assert "--faiss-codec PQ64x4fsr" in note and "--frame center-crop" in note
    assert framing_hint(1_000_000, 2, "IVF65536(HNSW32_SQfp16),PQ64x4fsr", 256) is None
