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

``evaluate`` scores leave-one-out Recall@1 per query (single: token 0 cosine; multi: the m query tokens' MaxSim
over the gallery's T) with or without a head; ``compare`` gives the difference with a paired bootstrap interval
over queries.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from regis.models.head import TokenHead
from training.losses.triplet import triplet_margin_losses
from training.photos.loss import maxsim_matrix
from training.photos.train import pca_init, project


def _head(cache: dict, out_dim: int, hidden: int, seed: int, tokens: int) -> TokenHead:
    torch.manual_seed(seed)
    t = cache["tokens"]
    head = TokenHead(t.shape[-1], out_dim, hidden)
    sample = torch.cat([t[:, 0, :tokens].flatten(0, 1), t.flatten(0, 2)])[:: max(1, len(t) // 200)]
    pca_init(head, sample)
    return head


def _opt(head: torch.nn.Module, extra: list, lr: float, steps: int):
    from timm.scheduler import CosineLRScheduler

    opt = torch.optim.AdamW(list(head.parameters()) + extra, lr=lr, weight_decay=1e-4)
    return opt, CosineLRScheduler(opt, t_initial=steps, lr_min=lr * 0.01, warmup_t=min(100, steps // 10),
                                  warmup_lr_init=lr * 0.01)


def train_triplet(cache: dict, steps: int = 2000, triplets: int = 64, out_dim: int = 256, hidden: int = 0,
                  lr: float = 1e-3, margin: float = 0.2, seed: int = 0, tokens: int = 10) -> tuple[TokenHead, list]:
    """A head trained with random multi-vector triplets (module docstring); returns it and the loss log."""
    head = _head(cache, out_dim, hidden, seed, tokens)
    opt, sched = _opt(head, [], lr, steps)
    labels = cache["labels"].numpy()
    by_class = {c: np.flatnonzero(labels == c) for c in np.unique(labels)}
    classes = list(by_class)
    rng = np.random.default_rng([seed, 3])
    views = cache["tokens"].shape[1]
    log, t0 = [], time.perf_counter()
    for step in range(steps):
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
        loss.backward()
        opt.step()
        log.append(float(loss.detach()))
    return head.eval(), [{"steps": steps, "seconds": round(time.perf_counter() - t0, 1),
                          "loss_first_100": float(np.mean(log[:100])), "loss_last_100": float(np.mean(log[-100:]))}]


def train_dmcac(cache: dict, steps: int = 2000, batch: int = 32, top_k: int = 12, refresh_every: int = 200,
                out_dim: int = 256, hidden: int = 0, lr: float = 1e-3, tau: float = 0.1, seed: int = 0,
                tokens: int = 10) -> tuple[TokenHead, list]:
    """A head trained with the DMCAC loss (module docstring); the CAC and CE heads are discarded. Returns the head
    and the loss log."""
    import faiss

    from training.dmcac.loss import DMCACLoss

    head = _head(cache, out_dim, hidden, seed, tokens)
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
    for step in range(steps):
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
        out["loss"].backward()
        opt.step()
        log.append(float(out["loss"].detach()))
    return head.eval(), [{"steps": steps, "seconds": round(time.perf_counter() - t0, 1),
                          "loss_first_100": float(np.mean(log[:100])), "loss_last_100": float(np.mean(log[-100:]))}]


@torch.no_grad()
def evaluate(test: dict, head: TokenHead | None, tokens: int = 10, chunk: int = 500) -> dict[str, np.ndarray]:
    """Leave-one-out per-query Recall@1 hits (0 / 1) on view 0 of ``test``: {"single": ..., "multi": ...}."""
    t = test["tokens"][:, 0]
    labels = test["labels"]
    g = project(head, t[:, :tokens])
    q_all = project(head, t)
    out = {"single": [], "multi": []}
    for i in range(0, len(t), chunk):
        q = q_all[i : i + chunk]
        rows = torch.arange(i, min(i + chunk, len(t)))
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


