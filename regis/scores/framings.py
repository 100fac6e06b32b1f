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
