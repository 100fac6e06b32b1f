"""The token layout of framings scored apart (``EncoderConfig.score_framings``; METHODS.md section 1): both the
query's and the image's tokens are ``framings`` equal blocks, one per framing, one after the other (the central
square's first). The one check every scorer makes before it splits them (torch and numpy MaxSim, SQ4 codes,
explanations, the searcher's query check)."""

from __future__ import annotations

from regis.errors import ConfigError


def framing_split(m: int, n: int, framings: int) -> tuple[int, int]:
    """Tokens per framing of a query of ``m`` tokens and an image of ``n`` tokens, each ``framings`` equal blocks.

    Args:
        m, n: query and image (document) token counts.
        framings: framings scored apart (1: one MaxSim over all tokens; then any m and n split).

    Returns:
        (m // framings, n // framings).

    Raises:
        ConfigError (a ValueError): framings < 1, or m or n not a multiple of it.
    """
    if framings < 1 or m % framings or n % framings:
        raise ConfigError(f"{m} query and {n} image tokens do not split into {framings} framings (equal blocks, "
                          "one per framing)")
    return m // framings, n // framings


def perfect_score(m: int, framings: int) -> float:
    """The MaxSim score of a perfect match (every query token's best cosine 1) for a query of ``m`` tokens:
    the query's tokens per scored framing (``m / framings``; a "best" framing score keeps one framing's MaxSim),
    or all ``m`` with one MaxSim (``framings`` 1: a single framing, or "union"). A result's similarity in [0, 1]
    is its score over this (``SearchResponse.max_score``; METHODS.md section 1).

    Args:
        m: the query's token count.
        framings: framings scored apart (``EncoderConfig.score_framings``).

    Returns:
        m // framings, as a float.

    Raises:
        ConfigError (a ValueError): m < 1, framings < 1, or m not a multiple of framings.
    """
    if m < 1 or framings < 1 or m % framings:
        raise ConfigError(f"a query of {m} tokens does not split into {framings} framings scored apart")
    return float(m // framings)
