"""Exceptions shared by every regis subsystem.

Each carries a message written for the user (a CLI prints it, the service returns it as JSON), so callers
never need ``str()`` of an unexpected exception.
"""


class RegisError(Exception):
    """Base class of every error regis raises on purpose.

    Args:
        message: what is wrong, for the user.
        hint: what to do about it, when that is not in the message (the command line prints it as a second
            ``hint:`` line).
    """

    hint: str | None = None

    def __init__(self, *args, hint: str | None = None):
        super().__init__(*args)
        if hint is not None:
            self.hint = hint


class ConfigError(RegisError, ValueError):
    """A parameter is out of range or inconsistent (e.g. an even ROI size, an unknown backbone)."""


class WeightsError(RegisError):
    """Backbone weights cannot be found, downloaded or loaded."""


class ImageDecodeError(RegisError, ValueError):
    """Bytes that are not a decodable image: empty, truncated, unknown format, too large, a decompression bomb."""


class ImageTooLargeError(ImageDecodeError):
    """An image over the pixel limit (a possible decompression bomb) or an upload over the byte limit."""


class IndexFormatError(RegisError):
    """An index directory is missing, corrupt, or of an unsupported format version."""


class IndexMismatchError(RegisError):
    """An index was built with another encoder configuration than the one asked to search or extend it."""


class IndexLockedError(RegisError):
    """Another process holds the write lock of an index directory."""


class Interrupted(RegisError):
    """Work stopped by Ctrl-C or a termination signal; the message says what was kept (e.g. a build's staged
    embeddings, picked up by the next run)."""


class NotSupportedError(RegisError):
    """An operation this kind of index or deployment does not offer (e.g. explanations or writes on a sharded
    collection); the message says what to use instead."""


class UnavailableError(RegisError):
    """A part of a distributed deployment did not answer in time; ``code`` names which ("shards_unavailable",
    "encoder_unavailable"). Retrying later may succeed."""

    code = "unavailable"


class ShardsUnavailableError(UnavailableError):
    """Shards of a sharded collection failed or did not answer in time (``missing``: their numbers), so the
    ranking would be incomplete (``regis.sharding``)."""

    code = "shards_unavailable"

    def __init__(self, message: str, missing: list[int]):
        super().__init__(message)
        self.missing = missing


class EncoderUnavailableError(UnavailableError):
    """The remote encoder (Ray Serve's encoder deployment) failed or did not answer in time."""

    code = "encoder_unavailable"
