"""``regis train triplet`` and ``regis eval`` through the root CLI."""

import json

import pytest
from synthetic_data import write_stripes_folder
from typer.testing import CliRunner

from cli.main import app

TINY = ["--backbone", "vit-tiny-reg4-test", "--random-init", "--sampler", "pk", "--p", "3", "--k", "2",
        "--warmup-steps", "1",
        "--num-workers", "0", "--device", "cpu", "--quiet", "--eval-batch-size", "32"]


pytestmark = pytest.mark.usefixtures("one_thread")


def test_train_resume_and_eval(tmp_path):
    data = write_stripes_folder(tmp_path / "stripes", per_class=4)
    run = tmp_path / "run"
    runner = CliRunner()
    result = runner.invoke(app, ["train", "triplet", "--data", str(data), "--out", str(run), "--steps", "3",
                                 "--stop-at-step", "2", "--token-set", "cls+reg", *TINY])
    assert result.exit_code == 0, result.output
    assert "step 2 (stopped)" in result.output
    result = runner.invoke(app, ["train", "triplet", "--out", str(run), "--resume", "--lr", "1"])
    assert result.exit_code != 0 and "do not pass ['lr']" in str(result.exception)
    result = runner.invoke(app, ["train", "triplet", "--out", str(run), "--resume", "--quiet", "--num-workers", "0",
                                 "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "step 3 (finished)" in result.output and "test after (step 3)" in result.output

    report = tmp_path / "report.json"
    result = runner.invoke(app, ["eval", "--data", str(data), "--weights", str(run), "--out", str(report),
                                 "--num-workers", "0", "--device", "cpu", "--quiet", "--ks", "1,2"])
    assert result.exit_code == 0, result.output
    rep = json.loads(report.read_text())
    assert rep["encoder"]["token_set"] == "cls+reg" and rep["weights"]["source"].startswith("file:")
    assert rep["protocol"] == "leave-one-out" and rep["num_queries"] == 12
    assert set(rep["multi"]) == {"recall@1", "recall@2", "map@r", "r_precision"}
    summary = json.loads((run / "summary.json").read_text())
    after = summary["eval_after"]["multi"]  # same weights and test split -> the same numbers
    assert rep["multi"] == {key: after[key] for key in rep["multi"]}


def test_eval_starting_point_and_bad_options(tmp_path):
    data = write_stripes_folder(tmp_path / "stripes", per_class=3)
    runner = CliRunner()
    result = runner.invoke(app, ["eval", "--data", str(data), "--backbone", "vit-tiny-reg4-test", "--random-init",
                                 "--num-workers", "0", "--device", "cpu", "--quiet", "--split", "train"])
    assert result.exit_code == 0, result.output
    assert "imagefolder train (leave-one-out, 9 queries)" in result.output and "multi: recall@1=" in result.output
    result = runner.invoke(app, ["eval", "--data", str(data), "--backbone", "vit-tiny-reg4-test", "--random-init",
                                 "--ks", "1,50", "--num-workers", "0", "--quiet"])
    assert result.exit_code != 0 and "Recall@50" in str(result.exception)
    result = runner.invoke(app, ["train", "triplet", "--out", str(tmp_path / "r")])
    assert result.exit_code != 0 and "--data is required" in str(result.exception)


def test_the_recipes_list_the_shared_options_around_their_own_in_a_fixed_order():
    import typer

    from cli.train import _recipe_command

    train = typer.main.get_command(app).commands["train"]
    head = ["out", "data", "data_format", "train_classes", "skip_count_check", "backbone", "weights", "random_init",
            "init_seed", "token_set", "roi_size", "border", "cue_method", "image_size", "train_batchnorm"]
    tail = ["accum_steps", "lr", "head_lr", "weight_decay", "warmup_steps", "min_lr_ratio", "seed", "eval_every",
            "eval_max_images", "eval_batch_size", "log_every", "checkpoint_every", "resume", "device", "num_workers",
            "precision", "stop_at_step", "quiet"]
    own = {"triplet": ["sampler", "miner", "p", "k", "triplets_per_batch", "margin", "reducer", "steps"],
           "dmcac": ["split", "max_train_per_class", "views", "top_k", "retrieval", "faiss_index", "refresh_every",
                     "tau", "betas", "similarity", "batch_size", "epochs"]}
    for name, middle in own.items():
        assert [p.name for p in train.commands[name].params] == head + middle + tail, name
    with pytest.raises(TypeError, match="'seed'"):
        _recipe_command(lambda token_set="x", head_lr=1.0, eval_batch_size=1, **shared: None)


def test_train_head_cache_seed_keeps_the_caches_and_changes_only_the_training_seed(tmp_path, monkeypatch):
    """--seed 1 --cache-seed 0 reads seed 0's train (cache seeds 0, 1) and validation (10, 11) caches and trains
    with seed 1; without --cache-seed the caches follow --seed (issue 22's second training seed)."""
    import cli.train_head as th
    import regis.models.encoder as enc
    import training.photos.train as tr

    calls, configs = [], []
    monkeypatch.setattr(th, "_corpus", lambda corpus, cache: tmp_path)
    monkeypatch.setattr(enc, "build_encoder", lambda name: None)
    monkeypatch.setattr(th, "_instances", lambda encoder, corpus, cache, split, seed, *a: calls.append((split, seed)))
    monkeypatch.setattr(tr, "train_head", lambda train, val, out, config, **kw: configs.append(config) or {})
    runner = CliRunner()
    base = ["train", "head", "--out", str(tmp_path / "run"), "--cache", str(tmp_path), "--seed", "1", "--quiet"]
    assert runner.invoke(app, base + ["--cache-seed", "0"]).exit_code == 0
    assert runner.invoke(app, base).exit_code == 0
    assert calls == [("train", 0), ("val", 1), ("train", 1), ("val", 2)]
    assert [c.seed for c in configs] == [1, 1]
