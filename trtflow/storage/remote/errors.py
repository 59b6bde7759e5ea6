"""What can go wrong with a remote cache: it cannot be used at all, or one of its entries is not trustworthy."""

from __future__ import annotations

from trtflow.errors import EXIT_ENVIRONMENT, TrtflowError


class RemoteError(TrtflowError):
    """The remote cache cannot be used as configured (unreachable, no access, no bucket, newer format)."""

    exit_code = EXIT_ENVIRONMENT


class RemoteCorrupt(RemoteError):
    """A remote object or manifest does not match what its name promises; it was not used."""

    def __init__(self, message: str, digest: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.digest = digest


class Unreadable(RemoteCorrupt):
    """A remote entry that is not a plain file inside the remote's root (a symbolic link, a pipe, a device, or a
    path through a folder link): it is neither read nor written through."""


class TooLarge(RemoteCorrupt):
    """A remote entry holds more bytes than the reader allows (what a manifest promises, or a manifest's limit)."""
