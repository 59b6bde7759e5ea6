"""Every record is read through trtflow/storage/records.py, checked against its declared type and its caps, in
every command; and what the commands print carries no terminal control sequences (trtflow/terminal.py).

- a static audit: no module of trtflow/ (nor the baseline reader of stages/) parses JSON or calls
  ``Tree.read_json`` but records.py and a short list, each with its reason;
- every kind of `records.KINDS` (the test fails when a kind is added that it does not plant) is planted with wrong
  types, past its byte cap and nested past its depth, strings holding control sequences, and every command runs
  over it (`records_driver.py`, in one process per group of kinds): none ends in exit 70, none takes more than a
  few seconds or fetches a huge value into memory, none prints a control character.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from trtflow.storage import records
from trtflow.terminal import CONTROL, plain, visible

from . import records_driver

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(records_driver.__file__)

#: Modules that may parse JSON, and why: none of them parses a record.
ALLOWED = {
    "trtflow/storage/records.py": "the record reader itself",
    "trtflow/cli/results.py": "`show -f yaml` re-reads the JSON it has just written itself",
    "trtflow/execution/forkserver.py": "messages between trtflow's own runner and fork server, over a pipe",
    "trtflow/readtrace.py": "messages between the worker and the observed child it forked, over a pipe",
    "trtflow/storage/signing.py": "normalises a manifest it holds (a JSON round trip) before signing; reads nothing",
    "trtflow/provenance.py": "the provenance envelope the user names: capped at MAX_ENVELOPE, its DSSE signature "
                             "checked before its statement is used",
}
#: Readers of stages/ that read a record trtflow wrote (a committed baseline file).
STAGE_READERS = ("stages/measure/judging/baseline.py",)


def _parses(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner, name = ast.unparse(node.func.value), node.func.attr
            if (owner in ("json", "orjson", "ujson", "simplejson", "msgpack", "pickle", "marshal")
                    and name in ("loads", "load", "unpackb")) or name == "read_json":
                found.append((node.lineno, f"{owner}.{name}()"))
    return found


def test_no_code_reads_a_record_but_the_records_module() -> None:
    files = sorted(REPO.joinpath("trtflow").rglob("*.py"))
    assert len(files) > 50
    problems = []
    for path in [*files, *(REPO / rel for rel in STAGE_READERS)]:
        rel = path.relative_to(REPO).as_posix()
        for line, what in _parses(ast.parse(path.read_text(encoding="utf-8"))):
            if rel not in ALLOWED:
                problems.append(f"{rel}:{line}: {what} reads a record past trtflow/storage/records.py "
                                "(use records.read / records.parse with its RecordKind)")
    assert problems == [], "\n".join(problems)
    assert all((REPO / rel).is_file() for rel in ALLOWED)


def test_every_kind_of_record_is_planted() -> None:
    """A kind added to records.KINDS without a way to plant it fails here (and so is never left untested)."""
    covered = set(records_driver.PLANTERS) | records_driver.DIRECT
    assert set(records.KINDS) == covered, (f"not planted: {sorted(set(records.KINDS) - covered)}; "
                                           f"planted but not a kind: {sorted(covered - set(records.KINDS))}")


@pytest.mark.parametrize("value", [
    {"key": "0" * 32, "outputs": {}, "summary": "a string"},  # wrong type inside
    {"key": "0" * 32, "outputs": {}, "x": json.loads("[" * 60 + "]" * 60)},  # deeper than its cap
    {"key": "0" * 32, "outputs": {}, "x": "A" * (records.MANIFEST.limits.string + 1)},
    {"key": "0" * 32, "outputs": {}, "x": [0] * (records.MANIFEST.limits.items + 1)},
    {"key": 5, "outputs": {}},
])
def test_a_record_past_its_type_or_caps_is_damaged(value: object) -> None:
    with pytest.raises(records.Damaged) as caught:
        records.parse(records.MANIFEST, json.dumps(value), "nodes/00/x.json")
    assert "nodes/00/x.json" in caught.value.message and "verify --fix" in caught.value.hint


def test_text_past_the_byte_cap_or_nested_past_python_is_damaged_not_a_crash() -> None:
    with pytest.raises(records.Damaged, match="bytes, more than"):
        records.parse(records.FORMAT_FILE, b" " * (records.FORMAT_FILE.limits.bytes + 1))
    with pytest.raises(records.Damaged, match="nested"):
        records.parse(records.NODE_SUMMARY, "[" * 200_000 + "]" * 200_000)
    good = {"key": "0" * 32, "outputs": {}, "summary": {"notes": ["x"]}, "signature": "a new field passes"}
    assert records.parse(records.MANIFEST, json.dumps(good)) == good


def test_control_sequences_are_removed_for_a_terminal_and_shown_in_documents() -> None:
    hostile = "in\x1b]52;c;cHduZWQ=\x07put\x1b]0;title\x1b\\\x1b[2J\x1b[H\x9b2J\r:0\x07\x00\x7f\ttab\nline"
    assert plain(hostile) == "input:0\ttab\nline"
    assert CONTROL.search(visible(hostile).replace("\n", "").replace("\t", "")) is None
    assert "\\x1b]52" in visible(hostile)


#: Three groups of kinds, run in parallel under xdist; "controls" plants well-typed records whose text holds
#: control sequences (a model's tensor names and messages, as a stage records them).
GROUPS = [[*sorted(records.KINDS)[i::3], *(["controls"] if i == 0 else [])] for i in range(3)]


@pytest.mark.parametrize("kinds", GROUPS, ids=[f"group{i}" for i in range(len(GROUPS))])
def test_every_command_over_every_planted_record(kinds: list[str], tmp_path: Path,
                                                 plugin_env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, str(DRIVER), str(tmp_path), *kinds], env=plugin_env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    seen = {(r["kind"], r["variant"]) for r in found}
    assert seen == {(k, v) for k in kinds if k != "controls" for v in records_driver.VARIANTS} \
        | {("controls", "text") for k in kinds if k == "controls"}
    for r in found:
        where = f"{r['kind']} ({r['variant']}): trtflow {r['command']}"
        assert r["rc"] != 70, f"{where} ended in an internal error:\n{r['tail']}"
        assert r["seconds"] < 30, f"{where} took {r['seconds']} s"
        assert r["maxrss_mb"] < 700, f"{where}: the process grew to {r['maxrss_mb']} MB"
        assert not r["controls"], f"{where} printed control characters {r['controls']!r}"
