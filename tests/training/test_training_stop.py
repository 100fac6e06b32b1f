"""Ctrl-C / SIGTERM in the middle of a run writes a resumable checkpoint at the step it reached, and the
default warm-up no longer refuses a short run (issue 14, fault 13)."""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

import pytest
from synthetic_data import write_stripes_folder

from training.config import make_config
from training.engine.loop import Runtime, resume_triplet, train_triplet
from training.engine.recipe import Recipe

QUIET = Runtime(device="cpu", num_workers=0, progress=False)
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def stripes(tmp_path_factory) -> Path:
    return write_stripes_folder(tmp_path_factory.mktemp("data") / "stripes", per_class=8)


def _config(data: Path, **overrides):
    values = dict(data=str(data), backbone="vit-tiny-reg4-test", random_init=True, sampler="pk", p=3, k=4, steps=8,
                  lr=2e-3, warmup_steps=1, log_every=1, checkpoint_every=500, eval_max_images=None,
                  eval_batch_size=32)
    return make_config(**{**values, **overrides})


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_mid_run_leaves_a_resumable_checkpoint(stripes, tmp_path, monkeypatch, signum):
    """The signal arrives during step 3 of 8 (checkpoints every 500): the run stops after step 3 with
    trainer_state.pt at step 3, and --resume runs the remaining 5 steps."""
    real_after_step = Recipe.after_step

    def after_step(self, step, log):
        if step == 3:
            os.kill(os.getpid(), signum)
        return real_after_step(self, step, log)

    monkeypatch.setattr(Recipe, "after_step", after_step)
    run = tmp_path / "run"
    # what the process had before the run (SIG_IGN for SIGINT when started in the background by a shell)
    handlers_before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    stopped = train_triplet(_config(stripes), run, QUIET)
    assert stopped["step"] == 3 and not stopped["finished"] and stopped["interrupted"] == signal.Signals(signum).name
    assert (run / "trainer_state.pt").is_file() and (run / "encoder.safetensors").is_file()
    assert {s: signal.getsignal(s) for s in handlers_before} == handlers_before  # handlers restored
    monkeypatch.setattr(Recipe, "after_step", real_after_step)
    resumed = resume_triplet(run, QUIET)
    assert resumed["finished"] and resumed["this_session"]["steps"] == 5
    resumes = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in resumes if r["kind"] == "resume"] == [3]


def test_the_default_warmup_is_clamped_for_a_short_run(stripes, tmp_path, caplog):
    config = _config(stripes, steps=3, warmup_steps=100)  # the CLI default warm-up, a 3-step run
    with caplog.at_level(logging.WARNING, logger="regis.training"):
        summary = train_triplet(config, tmp_path / "run", QUIET)
    assert summary["finished"] and summary["step"] == 3
    assert "--warmup-steps 100" in caplog.text and "all 3 steps" in caplog.text
