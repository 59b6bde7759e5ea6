"""Ctrl-C and SIGTERM during a run: they only set the run's cancel event; the run stops at its next safe point.

A KeyboardInterrupt raised at an arbitrary bytecode (inside a print, a journal write, a library's callback) can
leave shared state half-updated, so the handler never raises: the scheduling loop checks the event at least every
0.25 s and running nodes are told through the same event. Handlers can only be installed from the main thread;
a run started from another thread (a notebook's worker, a service) leaves signals to its caller.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def cancel_on_signals(cancel: threading.Event) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        cancel.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
