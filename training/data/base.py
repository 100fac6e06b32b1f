"""A retrieval dataset: a training split and a class-disjoint evaluation protocol (METHODS.md section 3)."""

from __future__ import annotations

from dataclasses import dataclass, field

from training.data.images import LabeledImages


@dataclass(frozen=True)
class EvalSplit:
    """What a retrieval evaluation scores.

    Attributes:
        queries: the query images.
        gallery: the gallery images, or None for leave-one-out over ``queries`` (each query is removed from
            its own neighbours: CUB, Cars, SOP, ImageFolder, Fashion-MNIST).
    """

    queries: LabeledImages
    gallery: LabeledImages | None = None

    @property
    def leave_one_out(self) -> bool:
        """True when queries are searched among the other queries."""
        return self.gallery is None


@dataclass(frozen=True)
class RetrievalDataset:
    """A dataset with a class-disjoint train / test split.

    Attributes:
        name: "cub", "cars", "sop", "inshop", "fashion-mnist" or "imagefolder".
        root: where it was read from.
        train: the training images (labels = class ids).
        test: the evaluation split (leave-one-out or query vs gallery).
        recall_ks: the K of Recall@K the protocol reports (METHODS.md section 3).
        info: counts and split details, saved with results.
    """

    name: str
    root: str
    train: LabeledImages
    test: EvalSplit
    recall_ks: tuple[int, ...]
    info: dict = field(default_factory=dict)

    def summary(self) -> dict:
        """Counts of every split, JSON-ready."""
        out = {
            "name": self.name,
            "root": self.root,
            "train_images": len(self.train),
            "train_classes": self.train.num_classes,
            "protocol": "leave-one-out" if self.test.leave_one_out else "query-gallery",
            "test_queries": len(self.test.queries),
            "test_classes": self.test.queries.num_classes,
            "recall_ks": list(self.recall_ks),
        }
        if self.test.gallery is not None:
            out["test_gallery"] = len(self.test.gallery)
        return {**out, **self.info}
