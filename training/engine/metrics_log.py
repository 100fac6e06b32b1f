"""The run's JSON-lines metrics log (``metrics.jsonl``) and its plot (``metrics.png``)."""

from __future__ import annotations

import json
import math
from pathlib import Path


class MetricsLog:
    """Append-only JSON lines; each record has ``kind`` ("train", "eval", "resume") and ``step`` (optimiser
    steps completed).

    Args:
        path: the ``.jsonl`` file (created on the first append).
    """

    def __init__(self, path: Path):
        self.path = Path(path)

    def append(self, record: dict) -> None:
        """Write one record as a line (NaN written as null)."""
        clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in record.items()}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(clean) + "\n")

    def records(self) -> list[dict]:
        """Every record, in order ([] when the file does not exist)."""
        if not self.path.is_file():
            return []
        with open(self.path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    def truncate_after(self, step: int) -> None:
        """Drop records with a step after ``step`` (written after the checkpoint a resumed run starts from)."""
        kept = [r for r in self.records() if r.get("step", 0) <= step]
        with open(self.path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in kept)


def plot_metrics(
    records: list[dict], path: Path, title: str = "", loss_label: str = "triplet loss (MaxSim, mean over log interval)"
) -> None:
    """Two panels against the optimiser step: the training loss (y axis named ``loss_label``), and test Recall@1
    (single- and multi-vector).

    Writes a PNG with matplotlib's Agg backend.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in records if r.get("kind") == "train" and r.get("loss") is not None]
    evals = [r for r in records if r.get("kind") == "eval"]
    fig, (ax_loss, ax_r1) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], color="tab:red")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel(loss_label)
    for scoring, style in (("multi", "o-"), ("single", "s--")):
        pts = [(r["step"], r[scoring]["recall@1"]) for r in evals if scoring in r]
        if pts:
            ax_r1.plot(*zip(*pts, strict=True), style, label=f"{scoring}-vector")
    ax_r1.set_xlabel("step")
    ax_r1.set_ylabel("test Recall@1")
    ax_r1.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
