"""Every record trtflow reads back is read here, and only here: checked against its declared type and its caps
before any other code sees it.

A record is data trtflow (or a stage) wrote earlier and reads again: from the store (manifests and the node
summaries in them, no-op records, pins, refs and their ledgers, the output index under build/, the format file,
notes, lock holders), from the journal (run rows, node rows and their summaries, history rows, module sets),
from a remote cache (its format file, manifests), from a committed baseline file, and the chooser's, benchmark's
and validation's summaries the reports read. All of these may come from elsewhere (a cloned repository, a shared
store, a remote other machines write, a planted journal), so each is read as untrusted data:

- at most ``Limits.bytes`` bytes are parsed (a file larger than its confined `Kind`'s cap is not even read; a
  journal value larger than its cap is cut off in SQL, see `sql_capped`);
- the parsed value is walked once, without recursion, against ``Limits`` (depth, items of a list or an object,
  characters of a string, values in all), so a deeply nested or huge value never reaches a reader;
- it is then checked against its declared type (`conforms`: pydantic's strict rules, a string is not a number,
  without importing pydantic on every command; a differential test holds it to pydantic's `TypeAdapter`)
  from `trtflow.summaries` or from below (TypedDicts: keys a reader does not know pass, so a field a newer trtflow
  adds, such as a manifest's signature, is one more ``NotRequired`` key).

A record that fails is `Damaged` (a `ValueError`: readers treat it as absent or damaged, as they treat a file that
is not JSON), with a message naming the record, what is wrong and the fix. Nothing else in trtflow parses a
record (``json.loads``, ``Tree.read_json``): ``tests/reliability/test_records.py`` fails if code does, and plants
every kind of `KINDS` (wrong types, huge values, deep nesting) under every command.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NotRequired, Required, cast

from annotated_types import Len
from typing_extensions import TypedDict

from trtflow import summaries
from trtflow.storage.confined import kinds
from trtflow.storage.confined.names import Rel
from trtflow.storage.confined.tree import Tree
from trtflow.storage.conforms import problem as type_problem

log = logging.getLogger("trtflow.storage")

KiB = 1024
MiB = 1 << 20
FIX_STORE = "run `trtflow verify --fix` (it sets damaged records aside; stored results it can check are kept)"
FIX_JOURNAL = "run `trtflow verify --fix` (it resets a damaged journal; stored results are kept)"
#: What `sql_capped` puts in place of a journal value over its cap (the real value is never fetched).
TOO_LARGE = "\0trtflow: too large: "


@dataclass(frozen=True)
class Limits:
    """The most a record may hold: bytes of its text, nesting depth, items of one list or object, characters of
    one string (or bytes of one SQLite blob), values in all."""

    bytes: int = 16 * MiB
    depth: int = 48
    items: int = 200_000
    string: int = 4 * MiB
    values: int = 2_000_000


class Damaged(ValueError):
    """A record that breaks its declared type or its caps; ``message`` names it and says what is wrong."""

    def __init__(self, kind: RecordKind, where: str, reason: str, value: Any = None, typed: bool = False) -> None:
        self.kind, self.where, self.reason = kind, where, reason
        #: ``typed``: the value parsed and kept its caps, but broke its declared type (it is ``value`` then)
        self.value, self.typed = value, typed
        self.message = f"the {kind.name} {where} is damaged ({reason})".replace("  ", " ")
        self.hint = kind.fix
        super().__init__(f"{self.message}; {self.hint}")


@dataclass(frozen=True)
class RecordKind:
    """One kind of record: its name (said in messages), its declared type, its caps, where it is read from (the
    confined file kind of a file, or None for a value from the journal or a summary) and the fix to say."""

    name: str
    declared: Any
    limits: Limits = Limits()
    file: kinds.Kind | None = None
    fix: str = FIX_STORE


#: Every kind of record, by name: the test plants each one (a kind added here is planted by it).
KINDS: dict[str, RecordKind] = {}


def _kind(name: str, declared: Any, **options: Any) -> RecordKind:
    kind = RecordKind(name, declared, **options)
    KINDS[name] = kind
    return kind


# ----- the declared types of the store's records
Json = dict[str, Any]
Strings = dict[str, str]


class OutputEntry(TypedDict, total=False):
    digest: Required[str]
    size: Required[int]
    filename: Required[str]
    kind: Required[str]
    sha256: NotRequired[str | None]


class Manifest(TypedDict, total=False):
    """A node manifest (`storage/manifest.py` checks what its names may be). A new field (a signature) is one more
    key here; keys not declared pass unchecked but bounded."""

    key: Required[str]
    format: int
    outputs: Required[dict[str, OutputEntry]]
    summary: Json | None
    previous_summary: Json | None
    stage: str
    version: str | int | None
    code: str | None
    code_files: Any
    params: Any
    inputs: Any
    input_sources: Any
    files: Any
    facts: Any
    verdicts: Any
    reference: Any
    pre: str | None
    deps: Any
    absent: Any
    node: str
    recipe: str | None
    recipe_id: str | None
    run_id: str | None
    started: float | None
    duration: float | None
    committed: float
    peak_rss: int | None


class NoopEnvelope(TypedDict, total=False):
    envelope: Required[int]
    keys: Required[list[str]]
    record: Required[Json]


class PinObject(TypedDict, total=False):
    digest: Required[str]
    size: Required[int]


class PinInput(TypedDict, total=False):
    file: Required[str]
    objects: Required[dict[str, PinObject]]


class PinRecord(TypedDict, total=False):
    format: Required[str]  # "trtflow-pin/1"
    inputs: dict[str, PinInput]
    files: dict[str, PinObject]
    record: Json


class RefsFile(TypedDict, total=False):
    format: int
    nodes: Required[dict[str, Any]]  # entries each checked by refs._entries (a bad one is dropped alone)
    recipe_id: str | None
    name: str | None
    path: str | None
    host: str | None
    updated: float | None
    run_id: str | None
    legacy: bool


class LedgerLine(TypedDict, total=False):
    keys: Required[dict[str, Any]]  # each checked by refs._jsonl
    time: float | None
    run_id: str | None
    recipe_id: str | None
    name: str | None
    path: str | None
    host: str | None


class IndexFile(TypedDict, total=False):
    key: str | None
    node: str | None
    status: str | None
    format: int
    files: dict[str, dict[str, Any]]


class FormatFile(TypedDict, total=False):
    format: Required[int]
    written_by: str


class RemoteFormatFile(TypedDict, total=False):
    format: Required[int]
    hash: Required[str]


class ProgressLine(TypedDict, total=False):
    fraction: float | None
    message: str


class MissingMarker(TypedDict, total=False):
    since: Required[float]


class LockHolder(TypedDict, total=False):
    host: str
    pid: int


class RunRow(TypedDict, total=False):
    """A row of the journal's ``runs`` (or the columns of it a query selects: every key is optional)."""

    id: str
    recipe: str | None
    recipe_path: str | None
    started: float | None
    ended: float | None
    status: str | None
    command: str | None
    pid: int | None
    host: str | None
    recipe_id: str | None


class NodeRow(TypedDict, total=False):
    run_id: str | None
    node: str
    stage: str | None
    key: str | None
    status: str | None
    reason: str | None
    started: float | None
    ended: float | None
    duration: float | None
    log_path: str | None
    error: str | None
    summary: str | None
    peak_rss: int | None


class HistoryRow(TypedDict, total=False):
    recipe_id: str | None
    node: str
    figure: str
    measurement: str | None
    run_id: str | None
    recorded: float | None
    stage: str | None
    key: str | None
    value: float | None
    low: float | None
    high: float | None
    n: int | None
    unit: str | None
    better: str | None
    is_primary: int | None
    facts: str | None
    context: str | None


class BaselinePoint(TypedDict, total=False):
    batch_size: Required[int | None]
    streams: int | None
    latency_ms: Required[dict[str, float | None]]
    throughput_qps: Required[float | None]
    latency_ci_ms: dict[str, list[float] | None]
    throughput_ci_qps: list[float] | None


class BaselineBenchmark(TypedDict, total=False):
    stage: Required[Literal["benchmark"]]
    backend: str | None
    device: str | None
    repeats: int | None
    facts: Strings
    points: Required[list[BaselinePoint]]
    load: list[Json]
    generation: list[Json]  # a generation benchmark's levels (TTFT, TPOT), which its gates judge
    artifact: Json
    identity: str
    params: Json


class BaselineValidate(TypedDict, total=False):
    stage: Required[Literal["validate"]]
    facts: Strings
    passed: Required[bool | None]
    outputs: Required[dict[str, Json]]  # per output: figures, the error front (pairs), flags (`accuracy.compare`)
    task_metrics: Json


class Baseline(TypedDict, total=False):
    format: Required[str]  # "trtflow-baseline/1"
    recipe: str | None
    saved: str | None
    nodes: Required[dict[str, BaselineBenchmark | BaselineValidate]]


SMALL = Limits(bytes=64 * KiB, depth=8, items=1000, string=16 * KiB, values=10_000)
#: One journal row: its values are cut in SQL (`sql_capped`: `COLUMN_CAP`, larger for a summary or an error).
ROW = Limits(bytes=16 * MiB, depth=2, items=64, string=16 * MiB, values=64)

MANIFEST = _kind("manifest", Manifest, file=kinds.MANIFEST, limits=Limits(bytes=kinds.MANIFEST.cap))
NOOP_RECORD = _kind("no-op record", NoopEnvelope, file=kinds.NOOP_RECORD,
                    limits=Limits(bytes=kinds.NOOP_RECORD.cap, items=1_000_000, values=8_000_000))
PIN = _kind("pin", PinRecord, file=kinds.PIN, limits=Limits(bytes=kinds.PIN.cap))
REFS = _kind("refs file", RefsFile, file=kinds.REFS,
             limits=Limits(bytes=kinds.REFS.cap, items=1_000_000, values=8_000_000))
LEDGER_LINE = _kind("refs ledger line", LedgerLine, file=kinds.LEDGER,
                    limits=Limits(bytes=4 * MiB, items=100_000, values=400_000))
INDEX = _kind("output index", IndexFile, file=kinds.INDEX, limits=Limits(bytes=kinds.INDEX.cap))
FORMAT_FILE = _kind("format file", FormatFile, file=kinds.FORMAT_FILE, limits=SMALL)
DAMAGED_NOTE = _kind("damaged note", Json, file=kinds.NOTE, limits=SMALL)
MISSING_MARKER = _kind("missing marker", MissingMarker, file=kinds.NOTE, limits=SMALL)
LOCK_HOLDER = _kind("lock holder", LockHolder, file=kinds.NOTE, limits=SMALL)
REMOTE_FORMAT = _kind("remote format file", RemoteFormatFile, limits=SMALL,
                      fix="fix or remove the remote's format.json")
REMOTE_MANIFEST = _kind("remote manifest", Manifest, limits=Limits(bytes=kinds.MANIFEST.cap),
                        fix="remove the remote's manifest (the node is built again and pushed)")
RUN_ROW = _kind("journal run", RunRow, limits=ROW, fix=FIX_JOURNAL)
NODE_ROW = _kind("journal node", NodeRow, limits=ROW, fix=FIX_JOURNAL)
HISTORY_ROW = _kind("journal history row", HistoryRow, limits=ROW, fix=FIX_JOURNAL)
DEP_SET = _kind("journal module set", Annotated[list[list[str]], Len(2, 2)],
                limits=Limits(bytes=4 * MiB, depth=3, items=100_000, string=4 * KiB), fix=FIX_JOURNAL)
NODE_SUMMARY = _kind("node summary", Json, limits=Limits(bytes=16 * MiB), fix=FIX_JOURNAL)
FIGURE_FACTS = _kind("history facts", dict[str, Any], limits=SMALL, fix=FIX_JOURNAL)
BASELINE = _kind("baseline file", Baseline, limits=Limits(bytes=64 * MiB),
                 fix="pin it again with `trtflow baseline pin RECIPE -o FILE`, or restore it from version control")
SELECTION = _kind("selection summary", summaries.SelectionSummary, limits=Limits(),
                  fix="run the chooser node again (`trtflow run RECIPE --force NODE`)")
BENCHMARK = _kind("benchmark summary", summaries.BenchmarkSummary, limits=Limits(),
                  fix="run the benchmark node again (`trtflow run RECIPE --force NODE`)")
JOB = _kind("job file", Json, file=kinds.JOB, limits=Limits(bytes=kinds.JOB.cap, items=1_000_000,
                                                               values=16_000_000),
            fix="run again (a node's scratch space is made afresh)")
PROGRESS_LINE = _kind("progress line", ProgressLine, limits=SMALL, fix="nothing to do: the next line replaces it")

#: Journal values (columns) are cut in SQL at this many bytes; a summary at its kind's cap.
COLUMN_CAP = ROW.string
SUMMARY_CAP = NODE_SUMMARY.limits.bytes


# ----- checking
def bounds_problem(value: Any, limits: Limits) -> str | None:
    """What in ``value`` (parsed JSON or SQLite values) goes past ``limits``, walked without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    seen = 0
    while stack:
        item, depth = stack.pop()
        seen += 1
        if seen > limits.values:
            return f"more than {limits.values} values"
        if isinstance(item, (str, bytes)):
            if len(item) > limits.string:
                return f"a string of {len(item)} characters, more than {limits.string}"
            if isinstance(item, str) and item.startswith(TOO_LARGE):
                return f"a value of {item[len(TOO_LARGE):]} bytes, more than {COLUMN_CAP}"
        elif isinstance(item, (dict, list, tuple)):
            if depth > limits.depth:
                return f"nested more than {limits.depth} deep"
            if len(item) > limits.items:
                return f"a {'list' if not isinstance(item, dict) else 'object'} of {len(item)} items, more than " \
                       f"{limits.items}"
            if isinstance(item, dict):
                stack.extend((k, depth + 1) for k in item)
                stack.extend((v, depth + 1) for v in item.values())
            else:
                stack.extend((v, depth + 1) for v in item)
    return None


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_PAIR = re.compile(rb"\[\]|\{\}")
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


def text_depth_problem(raw: bytes, limit: int) -> str | None:
    """Whether the JSON text ``raw`` nests deeper than ``limit``, found at the speed of ``re`` (each pass removes
    the innermost pairs of brackets outside strings: as many passes as the text is deep, at most ``limit + 1``)."""
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    for _ in range(limit):
        if not brackets:
            return None
        brackets = _PAIR.sub(b"", brackets)
    return f"nested more than {limit} deep" if brackets else None


def check(kind: RecordKind, value: Any, where: str = "", small: bytes | None = None) -> Any:
    """``value`` (already parsed) if it keeps ``kind``'s caps and declared type; raises `Damaged`. ``small``: the
    text it was parsed from, when too short to hold a string, a list or values past the caps (only its depth is
    checked then, on the text)."""
    problem = text_depth_problem(small, kind.limits.depth) if small is not None \
        else bounds_problem(value, kind.limits)
    if problem:
        raise Damaged(kind, where, problem)
    try:
        found = type_problem(kind.declared, value)
    except RecursionError:
        raise Damaged(kind, where, "nested too deep") from None
    if found is not None:
        path = ".".join(str(p) for p in found[0])
        raise Damaged(kind, where, f"{path + ': ' if path else ''}{found[1]}", value, typed=True)
    return value


def parse(kind: RecordKind, raw: bytes | str, where: str = "") -> Any:
    """The record ``raw`` (JSON text) parsed and checked (`check`); raises `Damaged`."""
    if isinstance(raw, str) and raw.startswith(TOO_LARGE):
        raise Damaged(kind, where, f"{raw[len(TOO_LARGE):]} bytes, more than {COLUMN_CAP}")
    if len(raw) > kind.limits.bytes:
        raise Damaged(kind, where, f"{len(raw)} bytes, more than {kind.limits.bytes}")
    try:
        value = json.loads(raw)
    except RecursionError:
        raise Damaged(kind, where, f"nested more than {kind.limits.depth} deep") from None
    except (ValueError, TypeError) as error:
        raise Damaged(kind, where, f"not valid JSON: {str(error)[:200]}") from None
    limits = kind.limits
    short = len(raw) <= min(limits.string, limits.items, limits.values)
    return check(kind, value, where, small=(raw.encode() if isinstance(raw, str) else raw) if short else None)


def read(tree: Tree, rel: Rel, kind: RecordKind) -> Any:
    """The record at ``rel`` below ``tree``: read through the confined layer at most its file cap, then `parse`\\ d.
    Raises FileNotFoundError, `Refused` (an OSError) or `Damaged` (a ValueError)."""
    assert kind.file is not None, f"{kind.name} is not a file record"
    data = tree.read_bytes(rel, kind.file)
    return parse(kind, data, str(tree.shown(rel)))


def lines(kind: RecordKind, data: bytes, where: str = "") -> Iterator[Any]:
    """The records of a JSON-lines ledger that pass `parse`; a damaged line (one cut short by a crash) is skipped."""
    for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        try:
            yield parse(kind, line, f"{where} line {number}")
        except Damaged:
            continue


def valid(kind: RecordKind, value: Any, where: str = "", warn: bool = True) -> bool:
    """True if ``value`` passes `check`; a failure is logged as a warning naming the record and the fix."""
    try:
        check(kind, value, where)
    except Damaged as exc:
        if warn:
            log.warning("ignoring %s", exc)
        return False
    return True


def summary_of(text: Any, where: str) -> dict[str, Any] | None:
    """A node summary as the journal keeps it (JSON text, or NULL), parsed and checked; None (with a warning naming
    it) when damaged, None when absent."""
    if text is None or text == "":
        return None
    try:
        return parse(NODE_SUMMARY, text if isinstance(text, (str, bytes)) else repr(text), where)
    except Damaged as exc:
        log.warning("ignoring %s", exc)
        return None


def rows(kind: RecordKind, found: Sequence[Mapping[str, Any]], where: str) -> list[dict[str, Any]]:
    """The journal rows of ``found`` that pass `check` (each one that does not is left out, with a warning)."""
    kept = []
    for number, row in enumerate(found):
        label = row.get("id") or row.get("node") if isinstance(row.get("id") or row.get("node"), str) else number
        if valid(kind, row, f"{where} ({str(label)[:80]})"):
            kept.append(dict(row))
    return kept


def sql_capped(columns: tuple[str, ...], alias: str = "", caps: Mapping[str, int] | None = None) -> str:
    """A SELECT list of ``columns`` where a value larger than its cap (`COLUMN_CAP` unless ``caps`` says) is
    replaced by `TOO_LARGE` and its size, so a planted 200 MB value is never fetched into memory."""
    prefix = f"{alias}." if alias else ""
    parts = []
    for column in columns:
        cap = (caps or {}).get(column, COLUMN_CAP)
        name = f"{prefix}{column}"
        parts.append(f"CASE WHEN length(CAST({name} AS BLOB)) > {int(cap)} THEN "
                     f"char(0) || '{TOO_LARGE[1:]}' || length(CAST({name} AS BLOB)) ELSE {name} END AS {column}")
    return ", ".join(parts)


def selection_of(summary: Any, where: str = "") -> summaries.SelectionSummary | None:
    """A summary as a selection when it has a selection's shape (a chooser node) and conforms to
    `summaries.SelectionSummary` (caps included), else None; one that looks like a selection but does not conform
    is said (a warning naming it and the fix) and left out."""
    if isinstance(summary, Mapping) and {"selected", "candidates", "objective"} <= set(summary) \
            and valid(SELECTION, summary, where):
        return cast(summaries.SelectionSummary, summary)
    return None


def benchmark_of(summary: Any, where: str = "") -> summaries.BenchmarkSummary | None:
    """A summary as a benchmark's when it has measured points and conforms to `summaries.BenchmarkSummary`, else
    None (one that has points but does not conform is said, as by `selection_of`)."""
    if isinstance(summary, Mapping) and "points" in summary and valid(BENCHMARK, summary, where):
        return cast(summaries.BenchmarkSummary, summary)
    return None
