"""The console script's start-up: Python's cyclic garbage collector stays off while modules load and the plan is
made, and comes back on before any work starts.

Start-up imports a few hundred modules and builds their classes, schemas and the plan: hundreds of thousands of
objects that live as long as the process and form almost no garbage cycles. With the collector on, every 700 new
objects start a collection that scans the young ones, and the older generations are scanned again and again as
they grow: a tenth of a no-op run's CPU (`bench/noop_overhead.py`). Reference counting frees everything that is not
in a cycle meanwhile. `collector_on` freezes what exists then (`gc.freeze`: never scanned again, nor by the full
collection at the interpreter's exit; without it the first collections walk everything start-up made and a no-op
run gains nothing: measured) and turns the collector back on: before the first node runs (`trtflow run`), before
any other command starts, and when the command ends. A caller that runs `main` in its own process (a test) and
wants what was frozen scanned again calls ``gc.unfreeze()`` after it.
"""

from __future__ import annotations

import gc

#: Whether `collector_off` turned the collector off (and `collector_on` has not yet turned it on): a collector
#: someone else turned off stays off. Start-up runs on the main thread; so do both functions.
_off_for_start_up = False


def collector_off() -> None:
    """Turn the cyclic collector off for start-up (where it is on)."""
    global _off_for_start_up
    if gc.isenabled():
        gc.disable()
        _off_for_start_up = True


def collector_on() -> None:
    """Freeze what start-up made and turn the collector on again, if `collector_off` turned it off (once; later
    calls do nothing)."""
    global _off_for_start_up
    if _off_for_start_up:
        _off_for_start_up = False
        gc.freeze()
        gc.enable()
