"""Triplet and DMCAC training of a token head on cached tokens, and class-level evaluation (issue 22).

The backbone is frozen and its tokens cached (``training.cached.cache``: (N, A, m, F) per image, view 0 the
evaluation transform); a ``regis.models.head.TokenHead`` (started as the PCA projection of the training tokens)
is trained on them:

- ``triplet``: METHODS.md section 1's multi-vector triplet loss with random triplets (a random class, anchor and
  positive from it, anchor != positive, a negative from another class), each image a random one of its cached
  views; S = MaxSim of the anchor's m tokens over the other's T tokens, margin 0.2 on the summed score;
- ``dmcac``: METHODS.md section 2's loss (``training.dmcac.loss.DMCACLoss``: L_frob + L_ce + L_cac) on the cached
  views of each query, the database (stratified half of each class) embedded through the head without gradient,
  held in a FAISS flat index, refreshed every ``refresh_every`` steps; top-k neighbours of each view, their union
  the context.

Against overfitting the training classes (both recipes): ``anchor`` > 0 adds anchor * ||theta - theta_0||^2, a
penalty keeping the head near its PCA start (L2-SP, Li et al., ICML 2018); ``val`` (a callable head -> score,
e.g. Recall@1 on held-out classes) is evaluated every ``val_every`` steps and the best head is returned (early
stopping); ``interpolate`` mixes the start back in, W = (1 - alpha) W_0 + alpha W (WiSE-FT, Wortsman et al.,
CVPR 2022).

``evaluate`` scores leave-one-out Recall@1 per query (single: token 0 cosine; multi: the m query tokens' MaxSim
over the gallery's T) with or without a head; ``compare`` gives the difference with a paired bootstrap interval
over queries.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import numpy as np
import torch

from regis.models.head import TokenHead
from training.losses.triplet import triplet_margin_losses
from training.photos.loss import maxsim_matrix
from training.photos.train import pca_init, project


def start_head(cache: dict, out_dim: int = 256, hidden: int = 0, seed: int = 0, tokens: int = 10) -> TokenHead:
    """The head both recipes start from: PCA of a sample of ``cache``'s tokens to ``out_dim`` (seeded)."""
    torch.manual_seed(seed)
    t = cache["tokens"]
    head = TokenHead(t.shape[-1], out_dim, hidden)
    sample = torch.cat([t[:, 0, :tokens].flatten(0, 1), t.flatten(0, 2)])[:: max(1, len(t) // 200)]
    pca_init(head, sample)
    return head


def restrict(cache: dict, classes) -> dict:
    """The images of ``cache`` whose label is in ``classes`` (same keys; ``config`` shared)."""
    keep = torch.isin(cache["labels"], torch.as_tensor(list(classes)))
    if not bool(keep.any()):
        raise ValueError(f"no image of classes {list(classes)} in the cache")
    return {**cache, "tokens": cache["tokens"][keep], "labels": cache["labels"][keep]}


def interpolate(start: TokenHead, head: TokenHead, alpha: float) -> TokenHead:
    """A head whose every parameter is (1 - alpha) * start's + alpha * head's (WiSE-FT; alpha in [0, 1])."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    out = copy.deepcopy(head)
    with torch.no_grad():
        for p, p0 in zip(out.parameters(), start.parameters(), strict=True):
            p.mul_(alpha).add_(p0, alpha=1.0 - alpha)
    return out.eval()


class _Keeper:
    """The L2-SP penalty towards the start and early stopping on ``val`` (module docstring)."""

    def __init__(self, head: TokenHead, anchor: float, val: Callable[[TokenHead], float] | None, val_every: int):
        self.start = copy.deepcopy(head).eval()
        self.anchor, self.val, self.val_every = anchor, val, val_every
        self.curve: list[dict] = []
        self.best: tuple[float, int, dict] | None = None

    def penalty(self, head: TokenHead) -> torch.Tensor:
        if not self.anchor:
            return torch.zeros(())
        return self.anchor * sum(((p - p0) ** 2).sum() for p, p0 in zip(head.parameters(), self.start.parameters(),
                                                                          strict=True))

    def check(self, head: TokenHead, step: int, force: bool = False) -> None:
        """Score ``head`` after ``step`` steps when a validation is due (or ``force``); keep the best state."""
        if self.val is None or (step % self.val_every and not force):
            return
        head.eval()
        score = float(self.val(head))
        head.train()
        self.curve.append({"step": step, "val": score})
        if self.best is None or score > self.best[0]:
            self.best = (score, step, copy.deepcopy(head.state_dict()))

    def finish(self, head: TokenHead, log: list, t0: float, steps: int) -> tuple[TokenHead, list]:
        """Score the final head (also when ``steps`` is no multiple of ``val_every``; once), restore the best
        one, and summarise the run."""
        if self.val is not None and (not self.curve or self.curve[-1]["step"] != steps):
            self.check(head, steps, force=True)
        summary = {"steps": steps, "seconds": round(time.perf_counter() - t0, 1),
                   "loss_first_100": float(np.mean(log[:100])), "loss_last_100": float(np.mean(log[-100:]))}
        if self.best is not None:
            head.load_state_dict(self.best[2])
            summary.update(best_step=self.best[1], best_val=self.best[0], val_curve=self.curve)
        return head.eval(), [summary]


def _last(steps: int, stop_after: int | None) -> int:
    if stop_after is not None and stop_after < 0:
        raise ValueError(f"stop_after must be >= 0, got {stop_after}")
    return steps if stop_after is None else min(steps, stop_after)


def _opt(head: torch.nn.Module, extra: list, lr: float, steps: int):
    from timm.scheduler import CosineLRScheduler

    opt = torch.optim.AdamW(list(head.parameters()) + extra, lr=lr, weight_decay=1e-4)
    return opt, CosineLRScheduler(opt, t_initial=steps, lr_min=lr * 0.01, warmup_t=min(100, steps // 10),
                                  warmup_lr_init=lr * 0.01)


def train_triplet(cache: dict, steps: int = 2000, triplets: int = 64, out_dim: int = 256, hidden: int = 0,
                  lr: float = 1e-3, margin: float = 0.2, seed: int = 0, tokens: int = 10, anchor: float = 0.0,
                  val: Callable[[TokenHead], float] | None = None, val_every: int = 100,
                  stop_after: int | None = None) -> tuple[TokenHead, list]:
    """A head trained with random multi-vector triplets (module docstring); returns it (with ``val``: the best
    head by ``val``, checked every ``val_every`` steps and at step 0) and the loss log. ``stop_after``: stop after
    that many steps of the ``steps``-long schedule (to reproduce an early-stopped run without its validation)."""
    head = start_head(cache, out_dim, hidden, seed, tokens)
    keep = _Keeper(head, anchor, val, val_every)
    opt, sched = _opt(head, [], lr, steps)
    labels = cache["labels"].numpy()
    by_class = {c: np.flatnonzero(labels == c) for c in np.unique(labels)}
    classes = list(by_class)
    rng = np.random.default_rng([seed, 3])
    views = cache["tokens"].shape[1]
    log, t0 = [], time.perf_counter()
    for step in range(_last(steps, stop_after)):
        keep.check(head, step)
        sched.step(step)
        c = rng.choice(classes, triplets)
        other = [(ci + rng.integers(1, len(classes))) % len(classes) for ci in c]
        a = np.array([rng.choice(by_class[ci]) for ci in c])
        p = np.array([rng.choice(by_class[ci][by_class[ci] != ai]) for ci, ai in zip(c, a, strict=True)])
        n = np.array([rng.choice(by_class[classes[o]]) for o in other])
        v = torch.from_numpy(rng.integers(0, views, (3, triplets)))
        t = cache["tokens"]
        q = project(head, t[torch.from_numpy(a), v[0]])
        dp = project(head, t[torch.from_numpy(p), v[1], :tokens])
        dn = project(head, t[torch.from_numpy(n), v[2], :tokens])
        pos = torch.einsum("bmd,btd->bmt", q, dp).amax(-1).sum(-1)
        neg = torch.einsum("bmd,btd->bmt", q, dn).amax(-1).sum(-1)
        loss = triplet_margin_losses(pos, neg, margin).mean()
        opt.zero_grad(set_to_none=True)
        (loss + keep.penalty(head)).backward()
        opt.step()
        log.append(float(loss.detach()))
    return keep.finish(head, log, t0, _last(steps, stop_after))


def train_dmcac(cache: dict, steps: int = 2000, batch: int = 32, top_k: int = 12, refresh_every: int = 200,
                out_dim: int = 256, hidden: int = 0, lr: float = 1e-3, tau: float = 0.1, seed: int = 0,
                tokens: int = 10, anchor: float = 0.0, val: Callable[[TokenHead], float] | None = None,
                val_every: int = 100, stop_after: int | None = None) -> tuple[TokenHead, list]:
    """A head trained with the DMCAC loss (module docstring); the CAC and CE heads are discarded. Returns the head
    (with ``val``: the best by ``val``; ``stop_after`` as ``train_triplet``) and the loss log."""
    import faiss

    from training.dmcac.loss import DMCACLoss

    head = start_head(cache, out_dim, hidden, seed, tokens)
    keep = _Keeper(head, anchor, val, val_every)
    labels = cache["labels"]
    classes = torch.unique(labels)
    remap = {int(c): i for i, c in enumerate(classes.tolist())}
    y = torch.tensor([remap[int(c)] for c in labels])
    rng = np.random.default_rng([seed, 4])
    query_idx, db_idx = [], []
    for c in range(len(classes)):
        members = rng.permutation(np.flatnonzero(y.numpy() == c))
        half = len(members) // 2
        query_idx += members[:half].tolist()
        db_idx += members[half:].tolist()
    query_idx, db_idx = np.array(query_idx), np.array(db_idx)
    loss_fn = DMCACLoss(out_dim, len(classes), tau=tau)
    opt, sched = _opt(head, list(loss_fn.parameters()), lr, steps)
    t = cache["tokens"]
    db, index = None, None
    log, t0 = [], time.perf_counter()
    for step in range(_last(steps, stop_after)):
        keep.check(head, step)
        if step % refresh_every == 0:
            with torch.no_grad():
                db = project(head, t[torch.from_numpy(db_idx), 0, 0])
            index = faiss.IndexFlatIP(db.shape[1])
            index.add(db.numpy())
        sched.step(step)
        qi = torch.from_numpy(rng.choice(query_idx, batch, replace=False))
        views = project(head, t[qi, :, 0])  # (B, A, D) global token of every cached view
        _, nn_idx = index.search(views.detach().reshape(-1, views.shape[-1]).numpy(), top_k)
        nn_idx = nn_idx.reshape(batch, -1)
        ctx_len = max(len(set(row.tolist())) for row in nn_idx)
        ctx = torch.zeros(batch, ctx_len, db.shape[1])
        mask = torch.zeros(batch, ctx_len, dtype=torch.bool)
        for b, row in enumerate(nn_idx):
            uniq = sorted(set(row.tolist()))
            ctx[b, : len(uniq)] = db[uniq]
            mask[b, : len(uniq)] = True
        out = loss_fn(views, ctx, mask, y[qi])
        opt.zero_grad(set_to_none=True)
        (out["loss"] + keep.penalty(head)).backward()
        opt.step()
        log.append(float(out["loss"].detach()))
    return keep.finish(head, log, t0, _last(steps, stop_after))


@torch.no_grad()
def evaluate(test: dict, head: TokenHead | None, tokens: int = 10, chunk: int = 500,
             queries: torch.Tensor | None = None) -> dict[str, np.ndarray]:
    """Leave-one-out per-query Recall@1 hits (0 / 1, float, (Q,)) on view 0 of ``test``: every image (or the
    images at ``queries``, (Q,) int64 indices) a query, all the other images the gallery.
    {"single": ..., "multi": ...}."""
    t = test["tokens"][:, 0]
    labels = test["labels"]
    g = project(head, t[:, :tokens])
    q_idx = torch.arange(len(t)) if queries is None else torch.as_tensor(queries, dtype=torch.int64)
    q_all = project(head, t[q_idx])
    out = {"single": [], "multi": []}
    for i in range(0, len(q_idx), chunk):
        q = q_all[i : i + chunk]
        rows = q_idx[i : i + chunk]
        for name, scores in (("single", q[:, 0] @ g[:, 0].T), ("multi", maxsim_matrix(q, g))):
            scores[torch.arange(len(rows)), rows] = float("-inf")
            out[name].append((labels[scores.argmax(1)] == labels[rows]).numpy().astype(float))
    return {k: np.concatenate(v) for k, v in out.items()}


def compare(after: np.ndarray, before: np.ndarray, draws: int = 4000, seed: int = 0) -> dict:
    """Mean of ``after`` - ``before`` (per-query hits) and its 95 % paired bootstrap interval over queries."""
    d = after - before
    boot = d[np.random.default_rng(seed).integers(0, len(d), (draws, len(d)))].mean(1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"before": float(before.mean()), "after": float(after.mean()), "diff": float(d.mean()),
            "lo": float(lo), "hi": float(hi)}


