"""Errors of the training subsystem (each message written for the user; the root CLI prints it)."""

from regis.errors import RegisError


class DatasetError(RegisError):
    """A dataset on disk is missing, incomplete or malformed; the message names the file or folder and what is off."""


class CheckpointError(RegisError):
    """A run directory cannot be resumed: a file is missing, unreadable, or inconsistent with the others."""
