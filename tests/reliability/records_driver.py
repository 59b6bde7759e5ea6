"""Plants every kind of record (`trtflow.storage.records.KINDS`) damaged three ways (wrong types, huge, deeply
nested; strings carrying terminal control sequences) and runs every command over each, in one process (the CLI's
`main`, in-process: a subprocess per command would cost a second each). Prints one JSON line per command run:
{kind, variant, command, rc, seconds, maxrss_mb, controls}; run by ``test_records.py``.

Usage: python records_driver.py WORK_DIR [KIND ...]
"""

from __future__ import annotations

import io
import json
import os
import resource
import shutil
import sqlite3
import sys
import time
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtflow.cli import main as cli
from trtflow.storage import records
from trtflow.terminal import CONTROL

RECIPE = """\
name: chain
nodes:
  - {name: a, stage: synth, params: {text: a, size: 100}}
  - {name: b, stage: synth, params: {text: b, size: 100}, inputs: {source: a}}
"""
ESCAPES = "\x1b]52;c;cHduZWQ=\x07\x1b]0;owned\x07\x1b[2J\x1b[H\x9b2J\r"  # clipboard, title, clear screen, C1, CR
VARIANTS = ("types", "huge", "deep")
#: Bytes of a planted journal value: past the cap of a summary (records.SUMMARY_CAP) and of any other column.
BIG = records.SUMMARY_CAP + (1 << 20)
STORE = ("--store", "store")
COMMANDS: list[tuple[str, ...]] = [
    ("run", "chain.yaml", "--executor", "inline", *STORE), ("plan", "chain.yaml", *STORE),
    ("status", "chain.yaml", *STORE),
    ("status", *STORE, "--json"), ("show", "chain.yaml", "a", *STORE),
    *[("report", "chain.yaml", "-f", f, *STORE) for f in ("markdown", "json", "html", "junit")],
    ("history", "chain.yaml", *STORE), ("verify", *STORE), ("gc", "--dry-run", *STORE),
    ("baseline", "show", "baseline.json"),
]


def invoke(args: tuple[str, ...]) -> tuple[int, str]:
    """``trtflow ARGS`` in this process: its exit code and everything it printed."""
    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv, sys.stdout, sys.stderr
    sys.argv, sys.stdout, sys.stderr = ["trtflow", *args], out, err
    code: Any = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code
    finally:
        sys.argv, sys.stdout, sys.stderr = saved
    return (code if isinstance(code, int) else (0 if code is None else 1)), out.getvalue() + err.getvalue()


# ----- bad values, from each kind's declared type
def _wrong(annotation: Any) -> Any:
    """A JSON value of another type than ``annotation`` (a string with control sequences where a string is not)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _wrong(args[0])
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        kinds = {typing.get_origin(a) or a for a in args}
        return 7 if str in kinds or dict in kinds else ESCAPES
    if annotation is str or origin is typing.Literal:
        return [ESCAPES]
    if annotation in (int, float, bool) or origin in (dict, list, tuple) or annotation in (dict, list):
        return ESCAPES
    return [ESCAPES]


def wrong_of(kind: records.RecordKind) -> Any:
    declared = kind.declared
    hints = typing.get_type_hints(declared, include_extras=True) if isinstance(declared, type) \
        and hasattr(declared, "__annotations__") else None
    if hints:
        return {name: _wrong(hint) for name, hint in hints.items()}
    return ESCAPES if typing.get_origin(declared) is not str else 5


def bad_text(kind: records.RecordKind, variant: str) -> str:
    """The planted record's text: wrong types, past its byte cap, or nested past its depth."""
    if variant == "types":
        return json.dumps(wrong_of(kind), ensure_ascii=False)
    if variant == "huge":
        return json.dumps({"x": "A" * (kind.limits.bytes + 1)})
    depth = max(100, min(100_000, kind.limits.bytes // 2 - 100))
    return '{"deep": ' + "[" * depth + "]" * depth + ', "text": "' + ESCAPES.replace("\x1b", "\\u001b") \
        .replace("\x07", "\\u0007").replace("\r", "\\r").replace("\x9b", "\\u009b") + '"}'


# ----- where each kind lives
def _one(root: Path, pattern: str) -> Path:
    found = sorted(root.glob(pattern))
    assert found, f"nothing matches {pattern} under {root}"
    return found[0]


def write_bad(path: Path, kind: records.RecordKind, variant: str) -> None:
    """Write the planted record (a huge one in pieces: the planting takes no memory of this process)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if variant != "huge":
        path.write_text(bad_text(kind, variant))
        return
    with path.open("w") as f:
        f.write('{"x": "')
        if kind.limits.bytes > 4 << 20:  # a sparse file past the cap: cheap to plant, as large to a reader
            f.seek(kind.limits.bytes + 1)
        else:
            f.write("A" * (kind.limits.bytes + 1))
        f.write('"}')


def _file(pattern: str) -> Callable[[Path, records.RecordKind, str], None]:
    def plant(root: Path, kind: records.RecordKind, variant: str) -> None:
        write_bad(_one(root, pattern) if "*" in pattern else root / pattern, kind, variant)
    return plant


def _manifest_beside(suffix: str) -> Callable[[Path, records.RecordKind, str], None]:
    def plant(root: Path, kind: records.RecordKind, variant: str) -> None:
        manifest = _one(root, "store/nodes/*/*.json")
        write_bad(manifest.with_name(manifest.stem + suffix), kind, variant)
        if suffix == ".damaged":
            manifest.unlink()  # the note is read where the manifest was removed
    return plant


def _sql(root: Path, *statements: tuple[str, tuple[Any, ...]]) -> None:
    """Run ``statements`` on the journal in a child process (the memory a huge value takes to plant is not this
    process's, whose peak tells whether a command fetched it)."""
    import subprocess

    code = ("import json, sqlite3, sys\nconn = sqlite3.connect(sys.argv[1])\nwith conn:\n"
            "    for sql, args in json.loads(sys.stdin.read()):\n"
            "        conn.execute(sql, [bytes.fromhex(a['blob']) if isinstance(a, dict) else a for a in args])\n")
    plain = [(sql, [{"blob": a.hex()} if isinstance(a, bytes) else a for a in args]) for sql, args in statements]
    subprocess.run([sys.executable, "-c", code, str(root / "store" / "trtflow.db")], input=json.dumps(plain),
                   text=True, check=True)


def _summary(root: Path, kind: records.RecordKind, variant: str) -> None:
    """A node's summary in the journal (the last run's row of each node)."""
    if variant == "huge":
        _sql(root, ("UPDATE node_runs SET summary = '{\"x\": \"' || hex(zeroblob(?)) || '\"}'", (BIG // 2,)))
    elif variant == "types":
        _sql(root, ("UPDATE node_runs SET summary = ?", (json.dumps(ESCAPES),)))
    else:
        _sql(root, ("UPDATE node_runs SET summary = ?", (bad_text(kind, "deep"),)))


def _shaped(keys: dict[str, Any]) -> Callable[[Path, records.RecordKind, str], None]:
    """A summary that has the shape a report looks for (``keys``), wrong inside."""
    def plant(root: Path, kind: records.RecordKind, variant: str) -> None:
        value: dict[str, Any] = dict(wrong_of(kind)) if variant == "types" else dict(keys)
        if variant == "huge":
            value[next(iter(keys))] = [0] * (kind.limits.items + 1)
        elif variant == "deep":
            value[next(iter(keys))] = json.loads("[" * 60 + "]" * 60)
        value.update({k: value.get(k, v) for k, v in keys.items()})
        _sql(root, ("UPDATE node_runs SET summary = ?", (json.dumps(value),)))
        manifest = _one(root, "store/nodes/*/*.json")
        data = json.loads(manifest.read_text())
        manifest.write_text(json.dumps(dict(data, summary=value)))
    return plant


def _row(table: str, column: str, wrong: Any) -> Callable[[Path, records.RecordKind, str], None]:
    def plant(root: Path, kind: records.RecordKind, variant: str) -> None:
        if variant == "huge":
            _sql(root, (f"UPDATE {table} SET {column} = hex(zeroblob(?))", (BIG // 2,)))
        elif variant == "types":
            _sql(root, (f"UPDATE {table} SET {column} = ?", (wrong,)))
        else:
            _sql(root, (f"UPDATE {table} SET {column} = ?", (bad_text(kind, "deep"),)))
    return plant


def _history(column: str) -> Callable[[Path, records.RecordKind, str], None]:
    def plant(root: Path, kind: records.RecordKind, variant: str) -> None:
        conn = sqlite3.connect(root / "store" / "trtflow.db")
        recipe_id = conn.execute("SELECT recipe_id FROM runs LIMIT 1").fetchone()[0]
        conn.close()
        row = {"recipe_id": recipe_id, "node": "a", "figure": "latency", "measurement": "m", "run_id": "r",
               "recorded": time.time(), "value": 1.0, "n": 3, "is_primary": 1, "facts": "{}", "context": "{}"}
        if variant == "huge":
            row[column] = ""  # made by SQLite below, not in this process
        elif variant == "types":
            row[column] = ESCAPES.encode() if column in ("facts", "context") else ESCAPES
            row["recorded"] = ESCAPES
        else:
            row[column] = bad_text(kind, "deep")
        _sql(root, (f"INSERT INTO history ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})",
                    tuple(row.values())))
        if variant == "huge":
            _sql(root, (f"UPDATE history SET {column} = hex(zeroblob(?)) WHERE measurement = 'm'", (BIG // 2,)))
    return plant


def _dep_set(root: Path, kind: records.RecordKind, variant: str) -> None:
    if variant == "huge":
        _sql(root, ("INSERT INTO dep_sets (pre, deps, used) VALUES (?, hex(zeroblob(?)), ?)",
                    ("0" * 32, BIG // 2, time.time())))
        return
    text = json.dumps([ESCAPES, 5]) if variant == "types" else bad_text(kind, "deep")
    _sql(root, ("INSERT INTO dep_sets (pre, deps, used) VALUES (?, ?, ?)", ("0" * 32, text, time.time())))


def _remote(what: str) -> Callable[[Path, records.RecordKind, str], None]:
    """A remote cache (--remote remote) the run consults: the local store loses its manifests."""
    def plant(root: Path, kind: records.RecordKind, variant: str) -> None:
        remote = root / "remote"
        manifests = sorted((root / "store" / "nodes").glob("*/*.json"))
        (remote / "format.json").parent.mkdir(parents=True, exist_ok=True)
        (remote / "format.json").write_text(json.dumps({"format": 1, "hash": "xxh3-128"}))
        for manifest in manifests:
            target = remote / "nodes" / manifest.parent.name / manifest.name
            target.parent.mkdir(parents=True, exist_ok=True)
            if what == "manifest":
                write_bad(target, kind, variant)
            else:
                target.write_text(manifest.read_text())
            manifest.unlink()
        if what == "format":
            write_bad(remote / "format.json", kind, variant)
    return plant


PLANTERS: dict[str, Callable[[Path, records.RecordKind, str], None]] = {
    "manifest": _file("store/nodes/*/*.json"),
    "no-op record": _file("store/noop/*.json"),
    "pin": _file("store/pins/pinned/" + "ab" * 16 + ".json"),
    "refs file": _file("store/refs/*/current.json"),
    "refs ledger line": _file("store/refs/*/history.jsonl"),
    "output index": _file("build/chain/a/.trtflow.json"),
    "format file": _file("store/format.json"),
    "damaged note": _manifest_beside(".damaged"),
    "missing marker": lambda root, kind, variant: write_bad(
        _one(root, "store/refs/*/current.json").with_name(".missing"), kind, variant),
    "lock holder": _file("store/holders/planted.json"),
    "remote format file": _remote("format"),
    "remote manifest": _remote("manifest"),
    "journal run": _row("runs", "recipe", ESCAPES.encode()),
    "journal node": _row("node_runs", "error", 12345),
    "journal history row": _history("figure"),
    "journal module set": _dep_set,
    "node summary": _summary,
    "history facts": _history("facts"),
    "baseline file": _file("baseline.json"),
    "selection summary": _shaped({"selected": "a", "candidates": [], "objective": {"percentile": "p50",
                                                                                    "description": "x"}}),
    "benchmark summary": _shaped({"points": [], "backend": "x", "device": "cpu", "repeats": 1}),
}
#: Kinds read inside a run's processes, not from the store: planted where their reader reads them, called directly.
DIRECT = {"job file", "progress line"}


def direct(work: Path, name: str, variant: str) -> None:
    from trtflow.execution.diagnosis import native_step
    from trtflow.execution.progress import last_progress

    kind = records.KINDS[name]
    folder = work / "direct"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    if name == "job file":
        write_bad(folder / "native_step.json", kind, variant)
        assert native_step(folder) is None
    else:
        text = bad_text(kind, variant)
        (folder / "progress.jsonl").write_text(text[-4000:] if variant != "types" else text)
        from trtflow.storage.confined.tree import Tree

        fraction, message = last_progress(Tree(folder))
        assert fraction is None and message == ""


def _peak_mb() -> int:
    """This process's peak resident memory in MB: the high-water mark of its own memory (VmHWM). Not getrusage's
    ru_maxrss, which Linux keeps across exec: launched from a test worker that had grown to 2 GB, it said 2 GB."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def pristine(work: Path) -> Path:
    """A project run twice (so the no-op record exists), with a baseline file, copied for each case."""
    base = work / "pristine"
    base.mkdir(parents=True)
    (base / "chain.yaml").write_text(RECIPE)
    from trtflow_stages.measure.judging.baseline import FORMAT

    (base / "baseline.json").write_text(json.dumps({"format": FORMAT, "recipe": "chain", "nodes": {}}))
    os.chdir(base)
    for _ in range(2):
        code, text = invoke(("run", "chain.yaml", *STORE))
        assert code == 0, text
    code, text = invoke(("verify", *STORE))  # the records trtflow writes pass their own checks
    assert code == 0 and "damaged" not in text, text
    for path in base.glob("store/**/*.json"):
        kind = records.NOOP_RECORD if path.parts[-2] == "noop" else \
            {"nodes": records.MANIFEST, "refs": records.REFS}.get(path.parts[-3])
        if kind is not None:
            records.parse(kind, path.read_bytes(), str(path))
    for path in base.glob("build/chain/*/.trtflow.json"):
        records.parse(records.INDEX, path.read_bytes(), str(path))
    for path in base.glob("store/refs/*/*.jsonl"):
        for line in path.read_bytes().splitlines():
            records.parse(records.LEDGER_LINE, line, str(path))
    records.parse(records.FORMAT_FILE, (base / "store" / "format.json").read_bytes())
    return base


def _controls(root: Path, kind: records.RecordKind, variant: str) -> None:
    """Well-typed records whose text holds control sequences (as a model's tensor names or messages would)."""
    summary = {"outputs": {f"logits{ESCAPES}": {"cosine_similarity": 1.0}}, "note": ESCAPES, "bytes": 100,
               "notes": [f"tensor out{ESCAPES}"]}
    _sql(root, ("UPDATE node_runs SET summary = ?, reason = ?, error = ?, status = 'failed'",
                (json.dumps(summary), f"changed {ESCAPES}", f"no tensor named in{ESCAPES}")))
    for manifest in root.glob("store/nodes/*/*.json"):
        manifest.write_text(json.dumps(dict(json.loads(manifest.read_text()), summary=summary)))


def main() -> None:
    work = Path(sys.argv[1]).absolute()
    wanted = sys.argv[2:] or sorted(records.KINDS)
    base = pristine(work)
    for name in wanted:
        for variant in (("text",) if name == "controls" else VARIANTS):
            if name in DIRECT:
                direct(work, name, variant)
                print(json.dumps({"kind": name, "variant": variant, "command": "direct", "rc": 0, "seconds": 0,
                                  "maxrss_mb": 0, "controls": ""}), flush=True)
                continue
            case = work / "case"
            os.chdir(work)
            shutil.rmtree(case, ignore_errors=True)
            shutil.copytree(base, case, symlinks=True)
            (_controls if name == "controls" else PLANTERS[name])(case, records.KINDS.get(name), variant)
            os.chdir(case)
            remote = ("--remote", "remote", "--no-push") if name.startswith("remote") else ()
            for args in COMMANDS:
                args = (*args, *remote) if args[0] == "run" else args
                started = time.monotonic()
                code, text = invoke(args)
                found = CONTROL.findall(text.replace("\n", "").replace("\t", ""))
                print(json.dumps({"kind": name, "variant": variant, "command": " ".join(args[:3]), "rc": code,
                                  "seconds": round(time.monotonic() - started, 3),
                                  "maxrss_mb": _peak_mb(),
                                  "controls": "".join(found)[:80], "tail": text[-300:] if code == 70 else ""}),
                      flush=True)


if __name__ == "__main__":
    main()
