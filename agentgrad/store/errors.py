"""The errors every store raises on bad input, whatever the backend; the message says what was wrong."""

from __future__ import annotations


class StoreError(Exception):
    """Base of every error a store raises on bad input (HTTP 400), and of `DiskFullError`."""


class NotFoundError(StoreError, KeyError):
    """An unknown rollout, attempt or resources id (HTTP 404)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class InvalidTransitionError(StoreError, ValueError):
    """A status change the state machine does not allow (HTTP 409)."""


class DiskFullError(StoreError):
    """The disk holding the store is full (HTTP 507): the write was not made, nothing stored was lost, reads
    still work. Not worth retrying until someone frees space there; the message says where."""


class StoreUnavailable(StoreError):
    """The database behind the store cannot be reached, or every connection to it is busy (HTTP 503): nothing
    was written, and the same call may succeed a moment later (clients retry it). The message says which."""
