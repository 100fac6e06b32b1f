"""DMCAC in the real training loop on a tiny random ViT with registers (METHODS.md section 2): refresh epochs,
the loss falls, exact resume, the exported encoder, retrieval modes, and the encoder through eval, the indexer
and the service."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from synthetic_data import write_stripes_folder

from regis.errors import ConfigError
from regis.models.encoder import build_encoder
from training.config import make_dmcac_config
from training.engine.checkpoint import load_trainer_state
from training.engine.loop import Runtime, resume_run, start_run
from training.errors import CheckpointError

QUIET = Runtime(device="cpu", num_workers=0, progress=False)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def stripes(tmp_path_factory) -> Path:
    # 6 classes x 8 images; train classes = the first 3 (24 images: 12 queries, 12 database when stratified)
    return write_stripes_folder(tmp_path_factory.mktemp("data") / "stripes", per_class=8)


def config(data: Path, **overrides):
    values = dict(
        data=str(data), backbone="vit-tiny-reg4-test", random_init=True, batch_size=4, views=3, top_k=4,
        epochs=4, refresh_every=2, lr=1e-3, head_lr=1e-2, warmup_steps=2, log_every=1, checkpoint_every=100,
        eval_max_images=None, eval_batch_size=32,
    )
    return make_dmcac_config(**{**values, **overrides})


def records(run: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def test_refresh_at_epochs_0_r_2r_and_the_loss_falls(stripes, tmp_path):
    run = tmp_path / "run"
    summary = start_run("dmcac", config(stripes, epochs=16, refresh_every=3), run, QUIET)
    info = json.loads((run / "config.json").read_text())
    assert info["recipe"] == "dmcac" and info["recipe_info"]["steps_per_epoch"] == 3
    assert info["recipe_info"]["queries"] == info["recipe_info"]["database"] == 12
    assert not info["recipe_info"]["overlap"] and info["recipe_info"]["num_classes"] == 3
    refreshes = records(run, "refresh")
    assert [r["epoch"] for r in refreshes] == [0, 3, 6, 9, 12, 15]
    assert [r["step"] for r in refreshes] == [0, 9, 18, 27, 36, 45]  # after the last step of epochs 2, 5, ...
    assert all(r["images"] == 12 for r in refreshes)
    assert load_trainer_state(run)["recipe"]["database"]["refreshed_at"] == [0, 3, 6, 9, 12, 15]
    assert summary["finished"] and summary["this_session"]["refreshes"] == [0, 3, 6, 9, 12, 15]
    train = records(run, "train")
    assert len(train) == 48
    loss0, ce0 = (np.mean([r[key] for r in train[:6]]) for key in ("loss", "ce"))
    loss1, ce1 = (np.mean([r[key] for r in train[-6:]]) for key in ("loss", "ce"))
    assert loss1 < 0.85 * loss0 and ce1 < 0.75 * ce0, (loss0, loss1, ce0, ce1)
    assert all(4 <= r["context_size"] <= 12 for r in train)  # k <= T <= A k
    for name in ("config.json", "encoder.safetensors", "trainer_state.pt", "metrics.jsonl", "metrics.png",
                 "summary.json"):
        assert (run / name).is_file(), name


def test_resume_continues_at_the_same_step_with_the_same_state(stripes, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    cfg = config(stripes, epochs=3, refresh_every=1)  # 9 steps, refresh after steps 3 and 6
    start_run("dmcac", cfg, full, QUIET)
    # stop mid-epoch (step 4), then exactly at a refresh (step 6), then run to the end
    assert start_run("dmcac", cfg, part, Runtime(device="cpu", progress=False, stop_at_step=4))["step"] == 4
    state = load_trainer_state(part)
    assert state["step"] == 4 and state["sampler"] == {"seed": 0, "next_step": 4}
    assert state["recipe"]["database"]["refreshed_at"] == [0, 1]
    assert {"w_q.weight", "w_k.weight", "w_v.weight", "classifier.weight"} <= {
        k.removeprefix("cac.") for k in state["recipe"]["heads"]}
    assert resume_run(part, Runtime(device="cpu", progress=False, stop_at_step=6), "dmcac")["step"] == 6
    assert load_trainer_state(part)["recipe"]["database"]["refreshed_at"] == [0, 1, 2]
    resumed = resume_run(part, QUIET)
    assert resumed["finished"] and resumed["this_session"]["steps"] == 3
    assert [r["step"] for r in records(part, "resume")] == [4, 6]
    assert [r["epoch"] for r in records(part, "refresh")] == [r["epoch"] for r in records(full, "refresh")]
    for key in ("loss", "frob", "ce", "cac", "context_size"):
        assert [r[key] for r in records(part, "train")] == pytest.approx([r[key] for r in records(full, "train")],
                                                                          abs=1e-5), key
    a, b = load_trainer_state(full), load_trainer_state(part)
    for key, tensor in a["recipe"]["heads"].items():
        assert torch.allclose(tensor, b["recipe"]["heads"][key], atol=1e-5), key
    assert torch.allclose(a["recipe"]["database"]["embeddings"], b["recipe"]["database"]["embeddings"], atol=1e-5)
    x = torch.randn(2, 3, 64, 64)
    assert torch.allclose(build_encoder(weights=str(full)).encode(x), build_encoder(weights=str(part)).encode(x),
                          atol=1e-5)
    with pytest.raises(CheckpointError, match="dmcac run"):
        resume_run(part, QUIET, "triplet")


def test_exported_encoder_has_no_head_weights_and_round_trips(stripes, tmp_path):
    run = tmp_path / "run"
    start_run("dmcac", config(stripes, epochs=1), run, QUIET)
    fresh = build_encoder("vit-tiny-reg4-test", random_init=True)
    with safe_open(str(run / "encoder.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    assert keys == set(fresh.backbone.state_dict())  # the backbone's keys, nothing of the heads
    assert not any(word in k for k in keys for word in ("cac", "ce_head", "w_q", "w_k", "w_v"))
    rebuilt = build_encoder(weights=str(run))
    state = load_trainer_state(run)
    assert rebuilt.weights_info.sha256 == state["encoder_sha256"]
    heads = state["recipe"]["heads"]  # the heads stay in the trainer state: C_train = 3 classes, F x F projections
    assert heads["ce_head.weight"].shape == heads["cac.classifier.weight"].shape == (3, 32)
    assert heads["cac.w_q.weight"].shape == (32, 32)
    x = torch.randn(2, 3, 64, 64)
    assert not torch.allclose(fresh.encode(x), rebuilt.encode(x))


@pytest.mark.parametrize("overrides", [
    dict(split="overlap", retrieval="full"),
    dict(split="overlap", similarity="maxsim"),
    dict(retrieval="full", similarity="maxsim", betas=(1.0, 0.0, 1.0)),
    dict(betas=(0.0, 1.0, 0.0), views=1),
])
def test_modes_run_end_to_end(stripes, tmp_path, overrides):
    run = tmp_path / "run"
    summary = start_run("dmcac", config(stripes, epochs=1, eval_max_images=12, **overrides), run, QUIET)
    train = records(run, "train")
    assert summary["finished"] and all(np.isfinite(r["loss"]) for r in train)
    if overrides.get("views") == 1:  # plain CE: no database, no refresh
        assert records(run, "refresh") == [] and "context_size" not in train[0]
    elif overrides.get("retrieval") == "full":
        db = json.loads((run / "config.json").read_text())["recipe_info"]["database"]
        own = 1 if overrides.get("split") == "overlap" else 0  # the query is masked out of its own context
        assert all(r["context_size"] == db - own for r in train)


def _recipe(stripes, **overrides):
    from training.data.registry import open_dataset
    from training.dmcac.recipe import DMCACRecipe
    from training.engine.metrics_log import MetricsLog

    cfg = config(stripes, **overrides)
    recipe = DMCACRecipe(cfg, open_dataset(stripes))
    encoder = build_encoder("vit-tiny-reg4-test", random_init=True)
    torch.manual_seed(0)
    recipe.bind(encoder, torch.device("cpu"), False, 0)
    recipe.on_start(0, MetricsLog(Path("/dev/null")))
    return recipe, encoder


def test_overlap_context_never_holds_the_query_and_full_equals_topk_when_k_covers_the_database(stripes):
    recipe, encoder = _recipe(stripes, split="overlap", top_k=100)
    cache = recipe.cache
    assert len(cache) == 24 and np.array_equal(recipe.queries, recipe.database)
    index = np.array([0, 5, 17])
    with torch.no_grad():
        tokens = encoder(torch.randn(9, 3, 64, 64)).reshape(3, 3, -1, 32)
    emb = tokens[:, :, 0].clone()
    emb[:, 0] = cache.embeddings[index]  # view 0 = the query itself: its own item would be its top hit
    ctx, mask, _, pos = recipe.context(emb, tokens, index)
    for row, own in enumerate(index):
        assert own not in pos[row][mask[row]].tolist() and mask[row].sum() == 23
    labels = torch.from_numpy(recipe.labels[index])
    topk = recipe.heads(emb, ctx, mask, labels)
    recipe.config = recipe.config.model_copy(update={"retrieval": "full"})
    f_ctx, f_mask, _, f_pos = recipe.context(emb, tokens, index)
    assert f_ctx.shape == (3, 24, 32) and (f_mask.sum(1) == 23).all()
    full = recipe.heads(emb, f_ctx, f_mask, labels)
    for key in ("loss", "frob", "ce", "cac"):
        assert torch.allclose(topk[key], full[key], atol=1e-6), key


def test_dmcac_config_validation(stripes, tmp_path, caplog):
    with pytest.raises(ConfigError, match="views A >= 2"):
        config(stripes, views=1)
    with pytest.raises(ConfigError, match="not all 0"):
        config(stripes, betas=(0, 0, 0))
    with pytest.raises(ConfigError, match="retrieval"):
        config(stripes, retrieval="approx")
    with pytest.raises(ConfigError, match="lower --batch-size"):
        start_run("dmcac", config(stripes, batch_size=13), tmp_path / "r", QUIET)
    # A warm-up longer than the run is clamped to the run's steps with a warning naming the option (issue 14,
    # fault 13), no longer refused.
    with caplog.at_level("WARNING", logger="regis.training"):
        start_run("dmcac", config(stripes, epochs=1, warmup_steps=5), tmp_path / "r2", QUIET)
    assert "--warmup-steps 5" in caplog.text


def test_cli_train_resume_then_eval_index_and_serve_the_exported_encoder(stripes, tmp_path):
    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from cli.main import app
    from service.app import create_app
    from service.settings import Settings

    run, runner = tmp_path / "run", CliRunner()
    common = ["--backbone", "vit-tiny-reg4-test", "--random-init", "--batch-size", "4", "--views", "3", "--top-k",
              "4", "--epochs", "2", "--refresh-every", "1", "--warmup-steps", "1", "--betas", "1,1,0.5",
              "--num-workers", "0", "--device", "cpu", "--quiet", "--eval-batch-size", "32", "--eval-max-images", "0"]
    result = runner.invoke(app, ["train", "dmcac", "--data", str(stripes), "--out", str(run), "--stop-at-step", "2",
                                 *common])
    assert result.exit_code == 0, result.output
    assert "step 2 (stopped)" in result.output and "database refreshed at epochs [0]" in result.output
    result = runner.invoke(app, ["train", "dmcac", "--out", str(run), "--resume", "--betas", "1,1,1"])
    assert result.exit_code != 0 and "do not pass ['betas']" in str(result.exception)
    result = runner.invoke(app, ["train", "triplet", "--out", str(run), "--resume", "--quiet"])
    assert result.exit_code != 0 and "dmcac run" in str(result.exception)
    result = runner.invoke(app, ["train", "dmcac", "--out", str(run), "--resume", "--quiet", "--num-workers", "0",
                                 "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "step 6 (finished)" in result.output and "test after (step 6)" in result.output
    assert json.loads((run / "config.json").read_text())["trainer"]["betas"] == [1.0, 1.0, 0.5]

    report = tmp_path / "report.json"
    result = runner.invoke(app, ["eval", "--data", str(stripes), "--weights", str(run), "--out", str(report),
                                 "--num-workers", "0", "--device", "cpu", "--quiet"])
    assert result.exit_code == 0, result.output
    after = json.loads((run / "summary.json").read_text())["eval_after"]
    assert json.loads(report.read_text())["multi"] == after["multi"]  # the same encoder, the same numbers

    index = tmp_path / "index"
    result = runner.invoke(app, ["index", "build", str(stripes), "--index", str(index), "--weights", str(run),
                                 "--no-progress", "--workers", "0"])
    assert result.exit_code == 0, result.output
    query = next(iter(sorted(stripes.rglob("*.png"))))
    with TestClient(create_app(Settings(index_dir=index, weights=run))) as client:
        r = client.post("/v1/search", files={"file": ("q.png", query.read_bytes(), "image/png")},
                        params={"k": 3})
    assert r.status_code == 200, r.text
    top = r.json()["results"][0]
    assert top["path"] == str(query.relative_to(stripes)) and top["score"] == pytest.approx(10.0, abs=1e-3)
