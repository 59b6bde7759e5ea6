"""Signed results as a team uses them, through the real CLI: users and CI jobs (each its own key, its own HOME)
share a directory remote or an S3 remote (moto); one of them is not trusted. An untrusted writer's result for the
victim's exact key (in the remote, or in a cloned store) is never reused, the plan says why, and nothing ends in
exit 70; pull-request namespaces are read by their job only."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.reliability.plugins import subprocess_env, write_plugin_distribution
from trtflow import keys

CHAIN = """\
name: chain
nodes:
  - {name: a, stage: synth, params: {text: a, size: 30000}}
  - {name: b, stage: synth, params: {text: b, size: 20000}, inputs: {source: a}}
"""


class Team:
    """A project folder (its trtflow-trust.yaml) and its builders, each a config folder of its own."""

    def __init__(self, root: Path, remote: str | None) -> None:
        self.root, self.remote = root, remote
        self.project = root / "project"
        self.project.mkdir()
        (self.project / "chain.yaml").write_text(CHAIN)
        self.env = subprocess_env(write_plugin_distribution(root / "plugins"))

    def config(self, user: str) -> Path:
        return self.root / f"config-{user}"

    def cli(self, user: str, *args: str, secret: str | None = None) -> subprocess.CompletedProcess:
        env = dict(self.env, XDG_CONFIG_HOME=str(self.config(user)))
        env.pop(keys.ENV_KEY, None)
        if secret is not None:  # a CI job: its key comes from its secret store
            env[keys.ENV_KEY] = secret
        proc = subprocess.run([sys.executable, "-m", "trtflow.cli", *args], cwd=self.project, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode != 70, proc.stdout + proc.stderr
        return proc

    def keys(self, user: str, *args: str) -> str:
        """`trtflow keys ...` as ``user`` (in this process: no interpreter start per command)."""
        from typer.testing import CliRunner

        from trtflow.keys_cli import app

        out = CliRunner().invoke(app, [*args, *(["--project", str(self.project)] if args[0] in ("trust", "revoke",
                                                                                                  "list") else [])],
                                 env={"XDG_CONFIG_HOME": str(self.config(user)), keys.ENV_KEY: None})
        assert out.exit_code == 0, out.output
        return out.output

    def run(self, user: str, *extra: str, secret: str | None = None) -> subprocess.CompletedProcess:
        remote = ("--remote", self.remote) if self.remote else ()
        proc = self.cli(user, "run", "chain.yaml", "--store", str(self.root / f"store-{user}"), *remote, *extra,
                        secret=secret)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    def key_id(self, user: str) -> str:
        return keys.PublicKey.parse(self.keys(user, "show").strip()).id


def _team(tmp_path: Path, remote: str | None) -> Team:
    team = Team(tmp_path, remote)
    # the two commands of a team's set-up, per member: a key, and its public key in the committed trust file
    for user in ("alice", "bob"):
        team.keys(user, "create", user)
        team.keys(user, "trust")
    return team


def _poisoned_remote(tmp_path: Path, remote: str, mate: bool) -> None:
    team = _team(tmp_path, remote)
    mallory = team.key_id("mallory")  # a writer of the remote the project does not trust: first to push
    first = team.run("mallory")
    assert "2 built" in first.stdout, first.stdout
    assert f"Remote cache {remote}: pulled 0, pushed 2 (a, b)\n" in first.stdout, first.stdout
    victim = team.run("alice")
    assert "2 built" in victim.stdout, victim.stdout
    assert f"signed by a key this project does not trust: {mallory}" in victim.stdout, victim.stdout
    started = " ".join(next(line for line in victim.stdout.splitlines() if line.startswith("▶ a ")).split())
    assert started.startswith(f"▶ a never built; the remote cache's result was refused: signed by a key this "
                              f"project does not trust: {mallory} (calling itself "), victim.stdout
    [closing] = [line for line in victim.stdout.splitlines() if line.startswith("Remote cache ")]  # says it too
    assert closing.startswith(f"Remote cache {remote}: pulled 0, pushed 2 (a, b); refused 2 (a, b): signed by a key "
                              f"this project does not trust: {mallory} (calling itself "), closing
    if mate:  # alice's push replaced mallory's manifests: bob (trusted) reuses alice's results
        bob = team.run("bob")
        assert "0 built, 2 reused" in bob.stdout and "pulled from the remote cache" in bob.stdout, bob.stdout
        assert f"Remote cache {remote}: pulled 2 (a, b), pushed 0\n" in bob.stdout, bob.stdout


def test_an_untrusted_writer_of_a_directory_remote_is_never_reused(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    remote.mkdir()
    _poisoned_remote(tmp_path, str(remote), mate=True)


def test_an_untrusted_writer_of_an_s3_remote_is_never_reused(tmp_path: Path, s3_bucket: str) -> None:
    _poisoned_remote(tmp_path, f"s3://{s3_bucket}/team/cache", mate=False)


def test_a_cloned_store_of_another_user_is_rebuilt_and_a_revoked_teammate_too(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from trtflow.cli.app import app

    team = _team(tmp_path, None)
    team.run("mallory")
    mallory = team.key_id("mallory")
    shutil.copytree(tmp_path / "store-mallory", tmp_path / "store-alice")  # a .trtflow/ that came with a clone
    verify = CliRunner().invoke(app, ["verify", "--store", str(tmp_path / "store-alice")],
                                env={"XDG_CONFIG_HOME": str(team.config("alice"))})
    assert f"signed by {mallory} (" in verify.output and "UNKNOWN" in verify.output, verify.output
    alice = team.run("alice")
    assert "2 built" in alice.stdout, alice.stdout
    assert f"signed by a key this project does not trust: {mallory}" in alice.stdout, alice.stdout
    _provenance(team, mallory)
    # alice's results, copied to bob, are reused by bob until the project revokes alice's key
    shutil.copytree(tmp_path / "store-alice", tmp_path / "store-bob")
    assert "Nothing to do" in team.run("bob").stdout
    team.keys("bob", "revoke", team.key_id("alice"))
    again = team.run("bob")
    assert "2 built" in again.stdout and "signed by a revoked key" in again.stdout, again.stdout


def test_a_pull_request_namespace_is_read_by_its_job_and_never_by_main(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    remote.mkdir()
    team = _team(tmp_path, str(remote))
    team.keys("alice", "create", "ci-main")
    team.keys("alice", "trust", "ci-main")
    listed = team.keys("alice", "list")
    assert f"trusted  {team.key_id('alice')}  alice" in listed and "(signs results)" in listed, listed
    secret = team.keys("alice", "show", "ci-main", "--secret").strip()
    main = team.run("ci-main-job", secret=secret)
    assert "2 built" in main.stdout
    assert not list(team.config("ci-main-job").rglob("*.key")), "the CI key was written to disk"
    # a pull-request job (a key of its own, not trusted) reads main's namespace and writes its own
    (team.project / "chain.yaml").write_text(CHAIN.replace("text: b,", "text: pr,"))
    pr = team.run("ci-pr-job", "--remote-namespace", "pr-7")
    assert "1 built, 1 reused" in pr.stdout, pr.stdout
    assert list((remote / "namespaces" / "pr-7" / "nodes").rglob("*.json"))
    # main, on the same change, never reads the PR's namespace; told to, it reuses nothing an untrusted key signed
    main2 = team.run("ci-main-job2", "--no-push", secret=secret)
    assert "1 built, 1 reused" in main2.stdout and "namespaces" not in main2.stdout, main2.stdout
    pr_key = team.keys("ci-pr-job", "show").strip()
    main3 = team.run("ci-main-job3", "--no-push", "--remote-read-namespace", "pr-7", secret=secret)
    assert "1 built, 1 reused" in main3.stdout, main3.stdout
    assert f"does not trust: {keys.PublicKey.parse(pr_key).id}" in main3.stdout, main3.stdout
    team.keys("alice", "trust", pr_key)  # a PR job whose key the project trusts: main may take its results
    main4 = team.run("ci-main-job4", "--no-push", "--remote-read-namespace", "pr-7", secret=secret)
    assert "0 built, 2 reused" in main4.stdout, main4.stdout


def _provenance(team: Team, mallory: str) -> None:
    """What ships carries signed SLSA provenance that trtflow checks, and openssl alone too; nothing untrusted gets
    one, and a changed artifact or statement is refused."""
    import base64
    import json
    import os
    import shutil as sh

    import pytest

    from tests.reliability.plugins import EXAMPLE_PLUGIN
    from trtflow import provenance
    from trtflow.errors import TrtflowError
    from trtflow.storage.store import Store

    recipe, shipped = team.project / "chain.yaml", team.project / "build" / "chain" / "b" / "data.bin"
    saved = dict(os.environ)
    sys.path.insert(0, str(EXAMPLE_PLUGIN))
    try:
        os.environ["XDG_CONFIG_HOME"] = str(team.config("alice"))
        policy = keys.load_policy(team.project)
        with pytest.raises(TrtflowError, match=f"does not trust: {mallory}"):
            provenance.statement(recipe, [], Store(team.root / "store-mallory"), [])
        stmt = provenance.statement(recipe, [], Store(team.root / "store-alice"), [])
        env = provenance.envelope(stmt, keys.current_signer())
        path = team.root / "prov.json"
        path.write_text(json.dumps(env))
        checked, signer = provenance.check(path, policy, [shipped])
        assert signer == team.key_id("alice") and [s["name"] for s in checked["subject"]] == ["b/data.bin"]
        assert checked["predicate"]["buildDefinition"]["resolvedDependencies"][0]["name"] == "a/data.bin"
        if sh.which("openssl"):  # the deployment's check, without trtflow (README: Provenance)
            (team.root / "pub.pem").write_text(team.keys("alice", "show", "--pem"))
            body = base64.b64decode(env["payload"])
            (team.root / "pae.bin").write_bytes(provenance.pae(provenance.PAYLOAD_TYPE, body))
            (team.root / "sig.bin").write_bytes(base64.b64decode(env["signatures"][0]["sig"]))
            ok = subprocess.run(["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", "pub.pem", "-rawin", "-in",
                                 "pae.bin", "-sigfile", "sig.bin"], cwd=team.root, capture_output=True, text=True)
            assert ok.returncode == 0 and "Verified Successfully" in ok.stdout, ok.stdout + ok.stderr
        changed = team.root / "changed.bin"
        changed.write_bytes(shipped.read_bytes() + b"!")
        with pytest.raises(TrtflowError, match="is not a subject"):
            provenance.check(path, policy, [changed])
        forged = dict(stmt, subject=[{"name": "b/data.bin", "digest": {"sha256": "0" * 64}}])
        path.write_text(json.dumps(dict(env, payload=base64.b64encode(json.dumps(forged).encode()).decode())))
        with pytest.raises(TrtflowError, match="does not verify"):
            provenance.check(path, policy, [])
        mallory_key = keys.parse_secret(f"mallory:{base64.b64encode(os.urandom(32)).decode()}", "test")
        path.write_text(json.dumps(provenance.envelope(stmt, mallory_key)))
        with pytest.raises(TrtflowError, match="does not trust"):
            provenance.check(path, policy, [shipped])
    finally:
        sys.path.remove(str(EXAMPLE_PLUGIN))
        os.environ.clear()
        os.environ.update(saved)
