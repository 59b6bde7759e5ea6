"""Values of environment variables a recipe used, hidden in what trtflow prints.

A recipe reads environment variables through ``${VAR}`` (and a path may also spell ``$VAR``); their values then
flow into paths and parameters, and from there into messages ("file ... not found (looked at /resolved/path)").
A value may be a secret (a token in CI), and a recipe from a pull request is not trusted: whatever it makes
trtflow print could carry the secret into a public log. So each value read this way is noted here, and ``hide``
replaces it by its ``${NAME}`` spelling in text meant for a screen or a log (the CLI's errors, the run's node
messages and warnings, the plan). Values shorter than ``MIN_LENGTH`` characters are not hidden: they cannot be
told apart from ordinary text (``1``, ``fp16``) and hold no secret worth the name.

What this does not do: the values are still part of the recipe, so they are in node keys (as digests), in the
parameters recorded in the store's manifests and in what a remote cache receives. Never interpolate a secret
into a recipe; pass it to your code through the environment instead.
"""

from __future__ import annotations

import threading

MIN_LENGTH = 6

_lock = threading.Lock()  # the notes are written while recipes load and read by printers of any thread
_names: dict[str, str] = {}  # value -> the variable's name


def note(name: str, value: str) -> None:
    """Remember that the environment variable ``name`` gave ``value`` to a recipe."""
    if len(value) >= MIN_LENGTH:
        with _lock:
            _names.setdefault(value, name)


def hide(text: str) -> str:
    """``text`` with every noted value replaced by ``${NAME}`` (longest values first)."""
    with _lock:
        noted = sorted(_names.items(), key=lambda item: -len(item[0]))
    for value, name in noted:
        if value in text:
            text = text.replace(value, f"${{{name}}}")
    return text


def url_for_display(url: str) -> str:
    """A remote's URL as trtflow prints it: without user, password, query or fragment (where credentials or
    signed tokens travel), and with noted values hidden (``hide``)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        return hide(url)
    netloc = parts.netloc.rpartition("@")[2]
    if "@" in parts.netloc:
        netloc = "***@" + netloc
    return hide(urlunsplit((parts.scheme, netloc, parts.path, "", "")))
