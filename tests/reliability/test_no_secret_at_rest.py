"""Issue 41 (1): no secret at rest, none passed on unnamed.

Canary values in every place a secret can come from (the CI's signing key in ``TRTFLOW_SIGNING_KEY`` and in a
``TRTFLOW_SIGNING_KEY_FILE``, variables ``TRTFLOW_PASS_ENV`` names, one the node's code reads, a variable nobody
named, another ``TRTFLOW_*`` setting); every command run through the CLI as a user types it; then no file under the
project (the store ``.trtflow/`` with its journal, no-op records, manifests and logs; ``build/``; the reports and
the provenance written there), the user's config folder or HOME holds any of them (as text, base64 or hex), no
command printed one, and the node's code saw neither the key nor a setting outside the allow-list (in its
``os.environ``, its own ``/proc/self/environ``, or its worker's). A variable passed to the code stays keyed: a new
value makes the node stale.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.freshness import toy_plugin

# The node's code: what it saw, by name and sha256 of the value (never a value: its output is a file at rest)
CODE = """\
import hashlib, json, os


def _environ(path):
    try:
        with open(path, 'rb') as f:
            block = f.read()
    except OSError as exc:
        return {'(unreadable)': str(exc)}
    pairs = [item.partition(b'=') for item in block.split(b'\\0') if item]
    return {k.decode(errors='replace'): hashlib.sha256(v).hexdigest() for k, _, v in pairs}


def make():
    read = os.getenv('CANARY_READ', '')
    return json.dumps({
        'environ': {k: hashlib.sha256(v.encode()).hexdigest() for k, v in os.environ.items()},
        'self': _environ('/proc/self/environ'),
        'worker': _environ(f'/proc/{os.getppid()}/environ'),
        'read': hashlib.sha256(read.encode()).hexdigest(),
    }, sort_keys=True)
"""


def _key_text(name: str) -> tuple[str, bytes]:
    """A real signing key as CI holds it (``trtflow keys show --secret``): NAME:BASE64 of its 32-byte seed."""
    seed = os.urandom(32)
    return f"{name}:{base64.b64encode(seed).decode()}", seed


def _spellings(value: bytes) -> list[bytes]:
    return [value, base64.b64encode(value), base64.urlsafe_b64encode(value).rstrip(b"="), value.hex().encode(),
            value.hex().upper().encode()]


@pytest.fixture(scope="module")
def toy_stages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    with toy_plugin(tmp_path_factory.mktemp("toyplugin")) as paths:
        yield paths


def test_no_secret_is_at_rest_or_passed_on_unnamed(tmp_path: Path, toy_stages: list[str]) -> None:
    project, home, config, vault = (tmp_path / n for n in ("project", "home", "config", "vault"))
    for folder in (project, home, config, vault):
        folder.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (project / "canary.py").write_text(CODE)
    (project / "recipe.yaml").write_text(
        "name: r\nnodes:\n  - {name: code, stage: coder, params: {model: 'python:canary.py:make'}}\n")
    env_key, env_seed = _key_text("ci-env")
    file_key, file_seed = _key_text("ci-file")
    (vault / "ci.key").write_text(file_key)  # where CI writes its secret for TRTFLOW_SIGNING_KEY_FILE: not searched
    canary = {name: f"canary-{name.lower()}-{os.urandom(12).hex()}"
              for name in ("CANARY_PASSED", "CANARY_READ", "CANARY_UNNAMED", "TRTFLOW_CANARY_SETTING")}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRTFLOW_", "CANARY_"))}
    env.update(canary, PYTHONPATH=os.pathsep.join(toy_stages), COLUMNS="200", HOME=str(home),
               XDG_CONFIG_HOME=str(config), TRTFLOW_SIGNING_KEY=env_key,
               TRTFLOW_PASS_ENV="CANARY_PASSED,CANARY_READ")
    printed: list[str] = []

    def cli(*args: str, check: int = 0) -> str:
        proc = subprocess.run([sys.executable, "-m", "trtflow.cli", *args], cwd=project, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == check, f"{args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        printed.append(proc.stdout + proc.stderr)
        return proc.stdout

    def seen() -> dict[str, dict[str, str]]:
        return json.loads((project / "build" / "r" / "code" / "out.txt").read_text())

    assert "1 built" in cli("run", "recipe.yaml")
    assert "Nothing to do" in cli("run", "recipe.yaml")  # the no-op shortcut: its record written, then used
    assert list((project / ".trtflow" / "noop").iterdir())
    cli("plan", "recipe.yaml")
    cli("show", "recipe.yaml", "code")
    cli("show", "recipe.yaml", "code", "--json")
    cli("status")
    for fmt, name in (("json", "report.json"), ("html", "report.html"), ("markdown", "report.md")):
        cli("report", "recipe.yaml", "--format", fmt, "--output", name)
    cli("provenance", "recipe.yaml", "-o", "provenance.intoto.json")
    cli("keys", "list")
    cli("verify")

    sha = {name: hashlib.sha256(value.encode()).hexdigest() for name, value in canary.items()}
    first = seen()
    assert first["read"] == sha["CANARY_READ"]  # the code saw what it was passed
    assert {"CANARY_PASSED", "CANARY_READ"} <= set(first["environ"])
    key_sha = hashlib.sha256(env_key.encode()).hexdigest()
    for where in ("environ", "self", "worker"):  # its environment, its own process's, its worker's
        names, digests = set(first[where]), set(first[where].values())
        assert not {"TRTFLOW_SIGNING_KEY", "TRTFLOW_SIGNING_KEY_FILE", "TRTFLOW_CANARY_SETTING"} & names, where
        assert key_sha not in digests and sha["TRTFLOW_CANARY_SETTING"] not in digests, where
        assert "(unreadable)" not in names, first[where]
    assert "CANARY_UNNAMED" not in first["environ"]  # not named: not there

    keys = {"TRTFLOW_SIGNING_KEY": (env_key, env_seed)}
    _assert_nowhere(tmp_path, (project, home, config), printed, canary, keys)  # the first no-op record included

    # a variable passed to the code is keyed (through a digest): a new value makes the node stale
    env["CANARY_READ"] = canary["CANARY_READ"] = f"canary-read-again-{os.urandom(12).hex()}"
    assert "environment variable CANARY_READ changed" in cli("plan", "recipe.yaml")
    # the key from a file this time: the same must hold of it
    del env["TRTFLOW_SIGNING_KEY"]
    env["TRTFLOW_SIGNING_KEY_FILE"] = str(vault / "ci.key")
    assert "1 built" in cli("run", "recipe.yaml")
    assert seen()["read"] == hashlib.sha256(canary["CANARY_READ"].encode()).hexdigest()
    assert "Nothing to do" in cli("run", "recipe.yaml")
    cli("provenance", "recipe.yaml", "-o", "provenance.intoto.json")
    cli("report", "recipe.yaml", "--format", "json", "--output", "report.json")
    assert "TRTFLOW_SIGNING_KEY_FILE" not in seen()["worker"]
    # a no-op record of an older trtflow (which held values) is never used, and gc removes it
    older = project / ".trtflow" / "noop" / ("0" * 24 + ".json")
    older.write_text(json.dumps({"envelope": 1, "keys": [], "record": {"environment": canary}}))
    assert "Nothing to do" in cli("run", "recipe.yaml")
    assert "older trtflow" in cli("gc", "--dry-run")
    cli("gc")
    assert not older.exists() and list((project / ".trtflow" / "noop").iterdir())

    _assert_nowhere(tmp_path, (project, home, config), printed, canary, {"TRTFLOW_SIGNING_KEY": (env_key, env_seed),
                                                                        "the key file": (file_key, file_seed)})


def _assert_nowhere(tmp_path: Path, tops: tuple[Path, ...], printed: list[str], canary: dict[str, str],
                    keys: dict[str, tuple[str, bytes]]) -> None:
    """No canary value and no key (its text, its seed as bytes, base64 or hex) in any file under ``tops`` or in
    anything a command printed."""
    needles = {f"{name} ({spelling[:12]!r}...)": spelling
               for name, value in [*((n, v.encode()) for n, v in canary.items()),
                                   *((n, seed) for n, (_, seed) in keys.items())]
               for spelling in _spellings(value)}
    needles.update({f"{name}'s text": text.encode() for name, (text, _) in keys.items()})
    found = []
    searched = 0
    for top in tops:
        for folder, _, files in os.walk(top):
            for name in files:
                path = Path(folder) / name
                if path.is_symlink() or not path.is_file():
                    continue
                data = path.read_bytes()
                searched += 1
                found += [f"{path.relative_to(tmp_path)}: {what}" for what, needle in needles.items() if needle in data]
    for text in printed:
        found += [f"printed: {what}" for what, needle in needles.items() if needle in text.encode()]
    assert searched > 20 and (tops[0] / ".trtflow" / "trtflow.db").exists()
    assert not found, "\n".join(found)


def test_a_recorded_variable_is_a_digest_under_the_users_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    """What the key and the manifests keep of a variable the code sees: the same digest run after run for this
    user, no plain hash a reader of the store could try values against, and another user's is another."""
    from trtflow import depfile

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "me"))
    digest = depfile.env_digest("env:TOKEN", {"TOKEN": "1234"})
    assert digest == depfile.env_digest("env:TOKEN", {"TOKEN": "1234"}) != depfile.env_digest("env:TOKEN",
                                                                                               {"TOKEN": "1235"})
    assert hashlib.sha256(b"1234").hexdigest() not in digest and "1234" not in digest
    assert depfile.env_digest("env:OTHER", {"OTHER": "1234"}) != digest  # a value is keyed with its name
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "someone-else"))
    assert depfile.env_digest("env:TOKEN", {"TOKEN": "1234"}) != digest


@pytest.mark.parametrize("spelling", ["text: '${TRTFLOW_SIGNING_KEY}'", "model: 'python:$TRTFLOW_SIGNING_KEY/m.py:f'",
                                      "text: '${TRTFLOW_SIGNING_KEY_FILE:-none}'"])
def test_a_recipe_cannot_read_the_signing_key(tmp_path: Path, toy_stages: list[str], spelling: str) -> None:
    """A recipe (from a pull request, say) that spells the signing key's variable is refused, with the place and
    the fix, before its value could reach a parameter, a path, a record or a node."""
    stage = "coder" if "python:" in spelling else "source"
    spelling = spelling.replace("text:", "value:")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "recipe.yaml").write_text(f"name: r\nnodes:\n  - name: a\n    stage: {stage}\n"
                                          f"    params: {{{spelling}}}\n")
    key, seed = _key_text("ci")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(toy_stages), COLUMNS="200", TRTFLOW_SIGNING_KEY=key,
               TRTFLOW_SIGNING_KEY_FILE=str(tmp_path / "nowhere.key"))
    for command in ("plan", "run"):
        proc = subprocess.run([sys.executable, "-m", "trtflow.cli", command, "recipe.yaml", "--store", "store"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "signing key, which a recipe cannot read" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert key not in proc.stdout + proc.stderr and base64.b64encode(seed).decode() not in proc.stderr
        if "python:" not in spelling:
            assert "recipe.yaml:5" in proc.stderr, proc.stderr


def test_no_process_is_started_with_trtflows_own_environment() -> None:
    """Every process trtflow starts for a node gets `settings.node_environment` (no signing key, trtflow's
    settings by the allow-list): no module copies this process's environment for a child, and every process the
    executors start is given its environment explicitly."""
    import re

    import trtflow

    package = Path(trtflow.__file__).parent
    copying = re.compile(r"dict\(os\.environ\b|os\.environ\.copy\(|\*\*os\.environ\b|env=os\.environ\b")
    offenders = [str(p.relative_to(package)) for p in package.rglob("*.py") if copying.search(p.read_text())]
    assert offenders == [], offenders
    for path in (package / "execution").rglob("*.py"):
        text = path.read_text()
        for call in re.finditer(r"subprocess\.Popen\(", text):
            end = text.find("\n\n", call.start())
            assert "env=" in text[call.start():end], f"{path.name}: a process started without an explicit env"
    assert "node_environment()" in (package / "execution" / "forkserver.py").read_text()
    assert "node_environment()" in (package / "execution" / "local.py").read_text()


# A node's code that reads the environment block of its own process and of every ancestor it can reach (walking
# PPid in /proc/<pid>/status up to pid 1): the main trtflow process's among them. It writes what it read.
ANCESTORS = """\
import json, os


def _ppid(pid):
    with open(f'/proc/{pid}/status') as f:
        return int(next(line for line in f if line.startswith('PPid:')).split()[1])


def make():
    read, pid = {}, os.getpid()
    while pid > 1:
        try:
            with open(f'/proc/{pid}/environ', 'rb') as f:
                read[str(pid)] = f.read().decode('latin-1')
        except OSError as exc:
            read[str(pid)] = f'(unreadable: {exc})'
        pid = _ppid(pid)
    return json.dumps(read)
"""


def test_no_process_environment_block_holds_the_signing_key(tmp_path: Path, toy_stages: list[str]) -> None:
    """TRTFLOW_SIGNING_KEY given to `trtflow run` (a CI secret) is read into trtflow's memory at the CLI's start and
    erased from the main process's environment block before any process starts: a ``python:`` node that reads
    /proc/<pid>/environ of itself and every ancestor finds no trace of it (the key's name is a canary, its seed as
    text, base64 or hex), though it does read the main process's block; and the run still signs with that key."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "ancestors.py").write_text(ANCESTORS)
    (tmp_path / "recipe.yaml").write_text(
        "name: r\nnodes:\n  - {name: code, stage: coder, params: {model: 'python:ancestors.py:make'}}\n")
    canary = f"canary{os.urandom(8).hex()}"
    key, seed = _key_text(canary)
    mark = f"mark-{os.urandom(8).hex()}"  # a setting only the main process has (withheld from the nodes' processes)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTFLOW_")}
    env.update(PYTHONPATH=os.pathsep.join(toy_stages), COLUMNS="200", HOME=str(tmp_path / "home"),
               XDG_CONFIG_HOME=str(tmp_path / "config"), TRTFLOW_SIGNING_KEY=key, TRTFLOW_CANARY_MARK=mark)

    def cli(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "trtflow.cli", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        assert "warning" not in proc.stderr, proc.stderr
        return proc.stdout

    assert "1 built" in cli("run", "recipe.yaml")
    blocks = json.loads((tmp_path / "build" / "r" / "code" / "out.txt").read_text())
    main = [pid for pid, block in blocks.items() if f"TRTFLOW_CANARY_MARK={mark}" in block]
    assert main, f"the node read no block of the main trtflow process: {sorted(blocks)}"
    for pid, block in blocks.items():
        for needle in (canary, *(s.decode("latin-1") for s in _spellings(seed))):
            assert needle not in block, f"/proc/{pid}/environ holds the signing key ({needle[:10]}...)"
    # it signs with that key: the results' records and the provenance name its id, and the envelope verifies
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from trtflow.keys import PublicKey, key_id
    from trtflow.provenance import pae

    public = Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes(serialization.Encoding.Raw,
                                                                                 serialization.PublicFormat.Raw)
    cli("provenance", "recipe.yaml", "-o", "prov.json")
    envelope = json.loads((tmp_path / "prov.json").read_text())
    assert [s["keyid"] for s in envelope["signatures"]] == [key_id(public)]
    assert key_id(public) in base64.b64decode(envelope["payload"]).decode()  # the node's result, signed by it
    sig = base64.b64decode(envelope["signatures"][0]["sig"])
    assert PublicKey(canary, public).verifies(sig, pae(envelope["payloadType"], base64.b64decode(envelope["payload"])))
