"""Response models of match explanations (``?explain=true`` on search, ``POST /v1/explain``).

What each number means is in the field descriptions (they document the OpenAPI page); the computation is
``regis.scores.explain`` and ``regis.retrieve.explain``.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

BOX = ("[x0, y0, x1, y1] in the image's own pixels (origin top left, ends exclusive, after EXIF orientation): "
       "the N x N patch window this ROI token averages; null for CLS and register tokens, and for images "
       "indexed before buddy patches were stored")


class QueryToken(BaseModel):
    """One token of the query image."""

    index: int = Field(description="token position in the layout [CLS, reg1..regR, ROI-CLS, ROI-reg1..ROI-regR], "
                                   "then, for a query to a new CNN index (query_layout tokens+roi-cues), the 5 cue "
                                   "tokens of its 160 px ROI pass")
    name: str = Field(description="cls, reg1..regR, roi-cls, roi-reg1..roi-regR, then pass2-cls, "
                                  "pass2-reg1..pass2-regR where the query has them (CNN backbones: cls is "
                                  "the global pool and the registers are part tokens)")
    kind: str = Field(description="cls, register or roi")
    box: list[float] | None = Field(description=BOX)


class QueryTokens(BaseModel):
    """The query image's tokens and where its ROI tokens look."""

    width: int = Field(description="query image width, pixels")
    height: int = Field(description="query image height, pixels")
    grid: list[int] | None = Field(description="[h, w]: the encoder's patch grid over its input square (null: "
                                               "an indexed query image without stored buddy patches)")
    tokens: list[QueryToken]


class TokenMatch(BaseModel):
    """One query token's term of the MaxSim score: S = sum over query tokens of the best cosine."""

    query_token: int = Field(description="query token position (see query.tokens)")
    query_name: str = Field(description="its name (cls, reg1.., roi-cls, roi-reg1.., pass2-cls, pass2-reg1..)")
    result_token: int = Field(description="the result token it matched best: argmax of the cosine (first on ties)")
    result_name: str = Field(description="that token's name")
    similarity: float = Field(description="cosine of the two unit-norm tokens, in [-1, 1]")
    contribution: float = Field(description="what this query token adds to the result's score, in score units; "
                                            "the contributions sum to the score")
    share: float = Field(description="contribution / score: this token's fraction of the score (sums to 1)")
    result_box: list[float] | None = Field(description="if the matched result token is a ROI token: " + BOX)


class Explanation(BaseModel):
    """Why a result scored what it did: its MaxSim score term by term, one per query token."""

    score: float = Field(description="MaxSim score recomputed from the matches (= the result's score up to float "
                                     "rounding)")
    matches: list[TokenMatch]
    framing: str | None = Field(default=None, description="an index of two framings per image scored apart "
                                "(frame center-crop+aspect, framing_score best): the framing whose MaxSim is the "
                                "score, crop (the central square) or whole (the whole image); a query token matches "
                                "only the result's tokens of its own framing and only this framing's tokens "
                                "contribute (the other's: 0). Absent on other indexes")
    framing_scores: dict[str, float] | None = Field(default=None, description="with framing: each framing's MaxSim "
                                                    "score (the score is the larger)")


class ResultImage(BaseModel):
    """The indexed image of an explained pair."""

    id: int
    width: int = Field(description="pixels")
    height: int = Field(description="pixels")


class Heatmap(BaseModel):
    """Patch-level similarity of each query token over the result image."""

    grid: list[int] = Field(description="[h, w] patches")
    region: list[float] = Field(description="[x0, y0, x1, y1]: the result's pixels the h x w grid covers (the "
                                            "encoder's centre crop); patch (r, c) is cell r, c of it")
    values: list[list[list[float]]] = Field(description="values[i][r][c]: cosine of query token i with patch "
                                                        "(r, c) of the result, in [-1, 1]")


class PairExplanation(BaseModel):
    """One (query, indexed image) pair explained: token matches and per-token heatmaps."""

    index_version: int
    query: QueryTokens
    result: ResultImage
    explanation: Explanation
    heatmap: Heatmap
