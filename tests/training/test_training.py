"""End-to-end training on a tiny random ViT with registers: the loss falls, checkpoints round-trip through
``build_encoder(weights=RUN_DIR)``, and a resumed run continues exactly where it stopped."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from synthetic_data import write_stripes_folder

from regis.errors import ConfigError
from regis.models.encoder import build_encoder
from regis.models.weights import CONFIG_METADATA_KEY
from training.config import make_config
from training.engine.checkpoint import load_trainer_state, save_encoder
from training.engine.loop import Runtime, resume_triplet, train_triplet
from training.errors import CheckpointError

QUIET = Runtime(device="cpu", num_workers=0, progress=False)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def stripes(tmp_path_factory) -> Path:
    return write_stripes_folder(tmp_path_factory.mktemp("data") / "stripes", per_class=8)


def tiny_config(data: Path, **overrides):
    values = dict(
        data=str(data), backbone="vit-tiny-reg4-test", random_init=True, sampler="pk", p=3, k=4, steps=6, lr=2e-3,
        warmup_steps=1, log_every=1, checkpoint_every=3, eval_max_images=None, eval_batch_size=32,
    )
    return make_config(**{**values, **overrides})


def losses(run: Path) -> list[float]:
    records = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    return [r["loss"] for r in records if r["kind"] == "train"]


def test_loss_falls(stripes, tmp_path):
    # Random triplets (the default sampler). Train classes: stripes of period 2 in three orientations; test
    # classes: period 6 in the same orientations, so what is learnt about orientation should transfer.
    run = tmp_path / "run"
    config = tiny_config(stripes, sampler="random", triplets_per_batch=8, steps=40, lr=1e-3, warmup_steps=4,
                         checkpoint_every=40)
    summary = train_triplet(config, run, QUIET)
    curve = losses(run)
    assert len(curve) == 40 and summary["finished"]
    first, last = sum(curve[:5]) / 5, sum(curve[-5:]) / 5
    assert last < 0.5 * first, curve
    assert last < config.margin  # below the margin: not the collapse where every score is equal (loss = margin)
    final = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"train"' in line][-1]
    assert final["pos_score"] > final["neg_score"]
    assert summary["eval_after"]["multi"]["map@r"] > summary["eval_before"]["multi"]["map@r"]
    for name in ("config.json", "encoder.safetensors", "trainer_state.pt", "metrics.jsonl", "metrics.png",
                 "summary.json"):
        assert (run / name).is_file(), name
    assert summary["eval_before"]["step"] == 0 and summary["eval_after"]["step"] == 40
    assert set(summary["eval_after"]["multi"]) == {
        "recall@1", "recall@2", "recall@4", "recall@8", "map@r", "r_precision"}


def test_checkpoint_round_trip(stripes, tmp_path):
    run = tmp_path / "run"
    train_triplet(tiny_config(stripes, steps=2, token_set="cls+reg+roi", roi_size=5), run, QUIET)
    cfg = json.loads((run / "config.json").read_text())
    with safe_open(str(run / "encoder.safetensors"), framework="pt") as f:
        stored = json.loads(f.metadata()[CONFIG_METADATA_KEY])
        keys = list(f.keys())
    assert stored == cfg["encoder"] and stored["roi_size"] == 5
    assert not any(k.startswith("backbone.") for k in keys) and "reg_token" in keys
    rebuilt = build_encoder(weights=str(run))
    assert rebuilt.config.model_dump(mode="json") == stored
    # The rebuilt encoder gives the tokens of the trained one: re-save it and compare with a fresh random encoder.
    x = torch.randn(3, 3, 64, 64)
    start = build_encoder("vit-tiny-reg4-test", random_init=True, roi_size=5)
    assert not torch.allclose(start.encode(x), rebuilt.encode(x))  # training changed the weights
    again = tmp_path / "again"
    again.mkdir()
    save_encoder(rebuilt, again)
    twice = build_encoder(weights=str(again))
    assert torch.equal(rebuilt.encode(x), twice.encode(x))
    assert twice.weights_info.sha256 == rebuilt.weights_info.sha256 == load_trainer_state(run)["encoder_sha256"]


def test_round_trip_keeps_token_set_and_cnn_image_size(tmp_path):
    enc = build_encoder("efficientnet-lite0", token_set="cls+reg", image_size=64)
    with torch.no_grad():  # move away from the packaged weights so the check is not vacuous
        for p in enc.backbone.parameters():
            p.add_(0.01 * torch.randn_like(p))
    save_encoder(enc, tmp_path)
    back = build_encoder(weights=str(tmp_path))
    assert back.config == enc.config and back.config.image_size == 64 and back.config.tokens_per_image == 5
    x = torch.randn(2, 3, 64, 64)
    assert torch.equal(enc.encode(x), back.encode(x))
    with pytest.raises(ConfigError, match="CNNs only"):
        build_encoder("vit-tiny-reg4-test", random_init=True, image_size=96)


def test_resume_continues_at_the_same_step(stripes, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    config = tiny_config(stripes, accum_steps=2)
    train_triplet(config, full, QUIET)
    stopped = train_triplet(config, part, Runtime(device="cpu", progress=False, stop_at_step=3))
    assert stopped["step"] == 3 and not stopped["finished"] and not (part / "summary.json").exists()
    state = load_trainer_state(part)
    assert state["step"] == 3 and state["sampler"] == {"seed": 0, "next_step": 3}
    assert state["scheduler"]["last_epoch"] == 3
    saved_opt = state["optimizer"]
    assert all(int(s["step"]) == 3 for s in saved_opt["state"].values())
    # Stale records written after the checkpoint (a crash) are dropped on resume.
    with open(part / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "train", "step": 4, "loss": 123.0}) + "\n")
    resumed = resume_triplet(part, QUIET)
    assert resumed["finished"] and resumed["this_session"]["steps"] == 3
    records = [json.loads(line) for line in (part / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "resume"] == [3]
    assert losses(part) == pytest.approx(losses(full), abs=1e-6)  # same batches, augmentations, optimizer state
    a, b = build_encoder(weights=str(full)), build_encoder(weights=str(part))
    x = torch.randn(2, 3, 64, 64)
    assert torch.allclose(a.encode(x), b.encode(x), atol=1e-5)
    final_a, final_b = load_trainer_state(full)["optimizer"], load_trainer_state(part)["optimizer"]
    for key, sa in final_a["state"].items():
        assert torch.allclose(sa["exp_avg"], final_b["state"][key]["exp_avg"], atol=1e-6)


def test_resume_guards(stripes, tmp_path):
    run = tmp_path / "run"
    with pytest.raises(CheckpointError, match="config.json"):
        resume_triplet(tmp_path, QUIET)
    train_triplet(tiny_config(stripes, steps=2, sampler="random", triplets_per_batch=4), run, QUIET)
    with pytest.raises(ConfigError, match="not empty"):
        train_triplet(tiny_config(stripes), run, QUIET)
    state = load_trainer_state(run)
    state["encoder_sha256"] = "0" * 64
    torch.save(state, run / "trainer_state.pt")
    with pytest.raises(CheckpointError, match="not the one"):
        resume_triplet(run, QUIET)


def test_config_validation():
    with pytest.raises(ConfigError, match="roi_size"):
        make_config(data="x", roi_size=4)
    assert make_config(data="x", steps=5, warmup_steps=10).warmup_steps == 10  # clamped by the run, with a warning
    with pytest.raises(ConfigError, match="miner"):
        make_config(data="x", miner="hardest")
