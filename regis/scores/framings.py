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


def framing_blocks(m: int, n: int, framings: int) -> list[tuple[slice, slice]]:
    """The blocks a framing-aware scorer multiplies: for each framing f, the rows of its query tokens and the
    columns of the image's tokens of the same framing (``framing_split``'s equal blocks, the central square's
    first). Scoring only these blocks is ``framings`` times fewer products than the full (m, n) similarity, of
    which a query token would use only its own framing's block (METHODS.md section 1).

    Args:
        m, n: query and image (document) token counts.
        framings: framings scored apart (1: one block, every query token against every image token).

    Returns:
        ``framings`` pairs (query rows, image tokens) of slices.

    Raises:
        ConfigError (a ValueError): as ``framing_split``.
    """
    mf, nf = framing_split(m, n, framings)
    return [(slice(f * mf, (f + 1) * mf), slice(f * nf, (f + 1) * nf)) for f in range(framings)]


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
