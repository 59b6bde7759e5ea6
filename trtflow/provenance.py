"""Provenance for what ships: a signed in-toto statement (SLSA provenance v1) over a recipe's final results.

`trtflow provenance RECIPE [NODE...] -o FILE` writes a DSSE envelope (``application/vnd.in-toto+json``) whose
statement names, as subjects, every output of the chosen nodes (default: the recipe's last nodes: the selected
engine, its Triton repository) and any extra file (``--include report.html``) by sha256, and as predicate
(``https://slsa.dev/provenance/v1``): the recipe and its nodes' parameters, every result they rest on (node,
output, sha256, the key that signed it, the tool versions it was built with, its verdicts), the git commit, and
the trtflow that built them. It is made only from results a key the project trusts signed, and signed by the
current builder's key (`trtflow.keys`). `trtflow verify --provenance FILE [--artifact PATH...]` checks it; a
deployment can check it with openssl alone (README: "Provenance").

DSSE signs ``PAE(type, body) = "DSSEv1" SP len(type) SP type SP len(body) SP body`` with ed25519.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import typer

from trtflow.errors import TrtflowError, UsageError
from trtflow.userfiles import open_file, read_file, write_file

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://trtflow.dev/provenance/recipe/v1"
MAX_ENVELOPE = 64 << 20


def pae(payload_type: str, body: bytes) -> bytes:
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def _iso(ts: Any) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts)) if isinstance(ts, (int, float)) else None


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open_file(path) as f:  # a regular file only: a named pipe or a device is refused, never waited on
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def statement(recipe: Path, nodes: list[str], store: Any, include: list[Path]) -> dict[str, Any]:
    """The in-toto statement of the latest results of ``nodes`` of ``recipe`` in ``store`` (and ``include``)."""
    from trtflow import __version__
    from trtflow.pipeline import load_pipeline
    from trtflow.storage.signing import trust_problem

    pipeline = load_pipeline(recipe)
    graph, identity = pipeline.graph, pipeline.identity
    unknown = [n for n in nodes if n not in graph.nodes]
    if unknown:
        raise UsageError(f"no node {', '.join(unknown)} in {recipe}", hint="name nodes of the recipe")
    chosen = nodes or [n for n in graph.nodes if not graph.downstream(n)]
    wanted, todo = set(), list(chosen)
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo += graph.upstream(name)
    refs = store.refs.current(identity.id)
    from trtflow.fsutil import project_root_of

    kctx = SimpleNamespace(project_root=project_root_of(recipe), memo={}, stat_cache=None, evidence=None)
    results, dependencies, commits = {}, [], set()
    for name in [n for n in graph.nodes if n in wanted]:
        key = refs.get(name)
        manifest = store.read_manifest(key) if key else None
        if manifest is None:
            raise TrtflowError(f"node {name} of {identity.id} has no stored result",
                               hint=f"run `trtflow run {recipe}` first")
        problem = trust_problem(store, manifest, kctx)
        if problem is not None:
            raise TrtflowError(f"node {name}'s result cannot be vouched for: it is {problem}",
                               hint=f"run `trtflow run {recipe}` to rebuild it with a trusted key")
        results[name] = manifest
        if manifest.get("source_commit"):
            commits.add(manifest["source_commit"])
        for out_name, out in sorted(manifest["outputs"].items()):
            entry = {"name": f"{name}/{out['filename']}", "digest": {"sha256": out["sha256"]},
                     "annotations": {"node": name, "output": out_name, "key": manifest["key"],
                                     "signer": manifest["signer"], "signer_name": manifest.get("signer_name"),
                                     "trtflow": manifest.get("trtflow"), "facts": manifest.get("facts") or {}}}
            if name not in chosen:
                dependencies.append(entry)
    subjects = [{"name": f"{n}/{out['filename']}", "digest": {"sha256": out["sha256"]}}
                for n in chosen for _, out in sorted(results[n]["outputs"].items())]
    subjects += [{"name": p.name, "digest": {"sha256": _sha256_file(p)}} for p in include]
    dependencies += [{"uri": "git+commit", "digest": {"gitCommit": c}} for c in sorted(commits)]
    started = [m.get("started") for m in results.values() if isinstance(m.get("started"), (int, float))]
    finished = [m.get("committed") for m in results.values() if isinstance(m.get("committed"), (int, float))]
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"recipe": identity.id,
                                       "nodes": {n: {"stage": results[n].get("stage"),
                                                     "params": results[n].get("params")} for n in chosen}},
                "internalParameters": {"keys": {n: m["key"] for n, m in results.items()}},
                "resolvedDependencies": dependencies,
            },
            "runDetails": {
                "builder": {"id": f"trtflow:{__version__}",
                            "builderDependencies": [{"name": "trtflow", "annotations": {"version": __version__}}]},
                "metadata": {"invocationId": results[chosen[0]].get("run_id") if chosen else None,
                             "startedOn": _iso(min(started)) if started else None,
                             "finishedOn": _iso(max(finished)) if finished else None},
                "byproducts": [{"name": f"{n}/summary", "annotations": {  # its measurements and verdicts
                    "signer": results[n]["signer"], "summary": results[n].get("summary") or {},
                    "facts": results[n].get("facts") or {}}} for n in chosen],
            },
        },
    }


def envelope(payload: dict[str, Any], signer: Any) -> dict[str, Any]:
    body = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    pub = signer.public
    return {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(body).decode(),
            "signatures": [{"keyid": pub.id, "sig": base64.b64encode(signer.sign(pae(PAYLOAD_TYPE, body))).decode()}]}


def check(path: Path, policy: Any, artifacts: list[Path]) -> tuple[dict[str, Any], str]:
    """The statement of the DSSE envelope at ``path`` if a key ``policy`` trusts signed it and every artifact is
    one of its subjects; (statement, signer id). Raises TrtflowError naming what does not hold."""
    hint = "make it again with `trtflow provenance`; never ship what does not verify"
    try:
        raw = read_file(path, MAX_ENVELOPE)
        env = json.loads(raw)
        body = base64.b64decode(env["payload"], validate=True)
        sigs = [(s["keyid"], base64.b64decode(s["sig"], validate=True)) for s in env["signatures"]]
        payload_type = env["payloadType"]
    except OSError as exc:
        raise TrtflowError(f"cannot read the provenance {path}: {exc.strerror or exc}", hint=hint) from None
    except (ValueError, KeyError, TypeError):
        raise TrtflowError(f"{path} is not a DSSE envelope of an in-toto statement", hint=hint) from None
    if payload_type != PAYLOAD_TYPE:
        raise TrtflowError(f"{path} carries {str(payload_type)[:80]!r}, not an in-toto statement", hint=hint)
    refusals = []
    for keyid, sig in sigs:
        refused = policy.verdict(keyid) if isinstance(keyid, str) else "a malformed key id"
        if refused is None and not policy.trusted[keyid].verifies(sig, pae(payload_type, body)):
            refused = f"its signature by {keyid} does not verify (forged or altered)"
        if refused is None:
            break
        refusals.append(refused)
    else:
        raise TrtflowError(f"the provenance {path} is not vouched for: {'; '.join(refusals) or 'no signature'}",
                           hint="trust the key that signed it (`trtflow keys trust`), if you trust who made it")
    try:
        stmt = json.loads(body)
        subjects = {s["digest"]["sha256"]: s["name"] for s in stmt["subject"]}
    except (ValueError, KeyError, TypeError):
        raise TrtflowError(f"the statement in {path} names no subjects", hint=hint) from None
    if stmt.get("_type") != STATEMENT_TYPE or stmt.get("predicateType") != PREDICATE_TYPE:
        raise TrtflowError(f"{path} is not SLSA provenance", hint=hint)
    for artifact in artifacts:
        try:
            digest = _sha256_file(artifact)
        except OSError as exc:
            raise TrtflowError(f"cannot read {artifact}: {exc.strerror or exc}") from None
        if digest not in subjects:
            raise TrtflowError(f"{artifact} (sha256 {digest}) is not a subject of {path}",
                               hint="it is not what the provenance describes: do not ship it")
    return stmt, keyid


def command(
    recipe: Annotated[Path, typer.Argument(help="The recipe file.")],
    nodes: Annotated[list[str] | None, typer.Argument(help="Nodes whose outputs ship (default: the recipe's last "
                                                           "nodes).")] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="Where the envelope is written.")] = Path(
        "provenance.intoto.json"),
    include: Annotated[list[Path] | None, typer.Option("--include", help="Another file that ships (the report), "
                                                                        "named by its sha256.")] = None,
    store: Annotated[str | None, typer.Option("--store", help="The store (default: TRTFLOW_STORE, or .trtflow "
                                                              "here).")] = None,
) -> None:
    """Write signed SLSA provenance (an in-toto statement in a DSSE envelope) for what a recipe ships."""
    from trtflow.keys import current_signer
    from trtflow.pipeline import default_store

    signer = current_signer()
    stmt = statement(recipe, list(nodes or []), default_store(store), list(include or []))
    write_file(output, json.dumps(envelope(stmt, signer), indent=1) + "\n")  # a random temporary, never a link
    print(f"wrote {output}: {len(stmt['subject'])} subjects, signed by {signer.public.id} ({signer.public.name})")
    for s in stmt["subject"]:
        print(f"  {s['digest']['sha256']}  {s['name']}")
