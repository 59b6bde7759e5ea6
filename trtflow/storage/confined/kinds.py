"""The kinds of file trtflow reads under the store and build/, each with the most bytes it reads of one."""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20
CHUNK = MiB  # bytes read or copied at a time


@dataclass(frozen=True)
class Kind:
    """A kind of file trtflow reads, with the most bytes it reads of one (a larger one is refused, not read)."""

    name: str
    cap: int


MANIFEST = Kind("manifest", 16 * MiB)
PIN = Kind("pin", 16 * MiB)  # pins/: a pinned artifact's digests and the record kept with it
REFS = Kind("refs file", 64 * MiB)  # current.json of a recipe of 50,000 nodes is about 8 MiB
LEDGER = Kind("refs ledger", 256 * MiB)  # history.jsonl, .pending.jsonl (gc trims history)
NOOP_RECORD = Kind("no-op record", 64 * MiB)
FORMAT_FILE = Kind("format file", 64 * 1024)
INDEX = Kind("output index", MiB)
NOTE = Kind("note", 64 * 1024)  # .damaged notes, .missing markers, lock holders, legacy refs
JOB = Kind("job file", 256 * MiB)  # job.json / result.json / native-step notes in a node's scratch space
LOG = Kind("log", 1 << 40)  # logs are read by their tail only
CACHE = Kind("shared cache", 4 << 30)  # a TensorRT timing cache
OBJECT = Kind("stored object", 1 << 50)  # objects are streamed (hashed, copied), never read whole
