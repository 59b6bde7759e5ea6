"""Files trtflow reads and writes outside the store, through the CLI, against what a cloned repository can commit
(issue 41, item 2): a link at a predictable temporary name, a trust file that is a named pipe or a link to
/dev/stdin, a model file or configuration that is a named pipe, a link to /dev/zero, or JSON nested past Python's
recursion limit. `trtflow.userfiles` owns the rules (see its docstring); `fsutil.input_path` is the one check of an
input that `init`, `plan` and `run` make.

A hang is a failure here: every subprocess runs with a timeout, and a command that reads a named pipe or /dev/stdin
(its stdin an open pipe nobody writes to) would never end on the code before this fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import trtflow_cli, trtflow_in_process
from tests.reliability.plugins import EXAMPLE_PLUGIN, subprocess_env, write_plugin_distribution
from trtflow import keys

CHAIN = "name: chain\nnodes:\n  - {name: a, stage: synth, params: {text: a, size: 300}}\n"
HANG = 120  # seconds: far beyond what a refusal takes on a loaded machine; a blocked read never ends


def _victim(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    victim = folder / name
    victim.write_text("precious\n")
    return victim


def _keys(config: Path, project: Path, *args: str) -> str:
    """`trtflow keys ...` in this process (its pid is the one a predictable temporary name would carry)."""
    from typer.testing import CliRunner

    from trtflow.keys_cli import app

    extra = ["--project", str(project)] if args[0] in ("trust", "revoke", "list") else []
    out = CliRunner().invoke(app, [*args, *extra], env={"XDG_CONFIG_HOME": str(config), keys.ENV_KEY: None})
    assert out.exit_code == 0, out.output
    return out.output


def test_keys_create_and_trust_never_write_through_a_planted_link(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The project (a clone) and the key folder carry links at the names the old code wrote to (``.<file>.<pid>``);
    `keys create` and `keys trust` leave what they point at alone, and write regular files."""
    project, config = tmp_path / "clone", tmp_path / "config"
    (project / ".git").mkdir(parents=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    pid = os.getpid()
    planted = {project / f".{keys.PROJECT_FILE}.{pid}": _victim(tmp_path / "home", "bashrc"),
               keys.keys_dir() / f".default.{pid}": _victim(tmp_path / "home", "profile")}
    keys.keys_dir().mkdir(parents=True)
    for link, victim in planted.items():
        link.symlink_to(victim)
    _keys(config, project, "create", "alice")
    _keys(config, project, "trust")
    for victim in planted.values():
        assert victim.read_text() == "precious\n", victim
    trust = project / keys.PROJECT_FILE
    assert not trust.is_symlink() and "alice:" in trust.read_text()
    assert (keys.keys_dir() / "default").read_text() == "alice\n" and not (keys.keys_dir() / "default").is_symlink()
    hidden = sorted(p.name for p in project.iterdir() if p.name.startswith("."))
    assert hidden == [".git", f".{keys.PROJECT_FILE}.{pid}"]  # no temporary file left behind


def test_a_trust_file_that_is_a_link_is_refused_and_the_file_it_names_is_left_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project, config = tmp_path / "clone", tmp_path / "config"
    (project / ".git").mkdir(parents=True)
    victim = _victim(tmp_path / "home", "bashrc")
    (project / keys.PROJECT_FILE).symlink_to(victim)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    monkeypatch.delenv(keys.ENV_KEY, raising=False)
    trtflow_in_process("keys", "create", "alice", cwd=project)
    out = trtflow_in_process("keys", "trust", cwd=project, check=1)
    assert f"cannot read the trust file {project / keys.PROJECT_FILE}: is a symbolic link" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and victim.read_text() == "precious\n"


def _chain_project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    (project / "chain.yaml").write_text(CHAIN)
    env = subprocess_env(write_plugin_distribution(tmp_path / "plugins"))
    env.update(XDG_CONFIG_HOME=str(tmp_path / "config"), TRTFLOW_STORE=str(tmp_path / "store"))
    env.pop(keys.ENV_KEY, None)
    return project, env


def test_provenance_never_writes_through_a_planted_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`trtflow provenance -o prov.json` with a link at ``.prov.json.<pid>`` (the old temporary name) and at
    ``prov.json`` itself: both are replaced or left, never written through."""
    project, env = _chain_project(tmp_path)
    run = subprocess.run([sys.executable, "-m", "trtflow.cli", "run", "chain.yaml"], cwd=project, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    monkeypatch.syspath_prepend(str(EXAMPLE_PLUGIN))
    monkeypatch.setenv("XDG_CONFIG_HOME", env["XDG_CONFIG_HOME"])
    out = project / "prov.json"
    temporary = _victim(tmp_path / "home", "bashrc")
    named = _victim(tmp_path / "home", "profile")
    (project / f".prov.json.{os.getpid()}").symlink_to(temporary)
    out.symlink_to(named)
    trtflow_in_process("provenance", "chain.yaml", "-o", "prov.json", "--store", env["TRTFLOW_STORE"], cwd=project)
    assert temporary.read_text() == "precious\n" and named.read_text() == "precious\n"
    assert not out.is_symlink() and '"payloadType"' in out.read_text()


@pytest.mark.parametrize("planted", ["stdin", "fifo"])
def test_a_trust_file_that_blocks_ends_plan_promptly_with_a_clear_error(tmp_path: Path, planted: str) -> None:
    """A committed trtflow-trust.yaml that is a link to /dev/stdin (stdin an open pipe nobody writes to) or a named
    pipe: `trtflow plan` ends at once, the stored result not reused and the plan saying why, instead of waiting for
    ever."""
    project, env = _chain_project(tmp_path)
    built = subprocess.run([sys.executable, "-m", "trtflow.cli", "run", "chain.yaml"], cwd=project, env=env,
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr  # a stored result: plan checks who signed it
    trust = project / keys.PROJECT_FILE
    if planted == "stdin":
        trust.symlink_to("/dev/stdin")
    else:
        os.mkfifo(trust)
    with open(tmp_path / "out", "w+") as out, open(tmp_path / "err", "w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "trtflow.cli", "plan", "chain.yaml"], cwd=project, env=env,
                                stdin=subprocess.PIPE, stdout=out, stderr=err)  # stdin stays open, never written
        try:
            proc.wait(timeout=HANG)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(f"trtflow plan waited on a trust file that is {planted} for {HANG} s")
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
    stdout, stderr = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
    said = stdout + stderr
    assert proc.returncode == 0 and "Traceback" not in said, said  # the result is not reused; the plan says why
    assert f"cannot read the trust file {trust}: " + (
        "is a symbolic link" if planted == "stdin" else "is not a regular file") in said, said
    assert "a     synth  stale" in stdout, stdout


@pytest.mark.parametrize("planted", ["fifo", "dev-zero"])
def test_a_planted_git_head_never_stops_a_run(tmp_path: Path, planted: str) -> None:
    """The commit a result came from is read from the clone's .git: a HEAD that is a named pipe or a link to
    /dev/zero leaves it unknown (old: the run blocked on the pipe, or read /dev/zero until memory ran out)."""
    project, env = _chain_project(tmp_path)
    head = project / ".git" / "HEAD"
    if planted == "fifo":
        os.mkfifo(head)
    else:
        head.symlink_to("/dev/zero")
    run = subprocess.run([sys.executable, "-m", "trtflow.cli", "run", "chain.yaml"], cwd=project, env=env,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=HANG)
    assert run.returncode == 0 and "1 built" in run.stdout, run.stdout + run.stderr


# ---------------------------------------------------------------------------------------- init's inputs
def _deep(path: Path) -> None:
    path.write_text("[" * 100_000 + "]" * 100_000)


#: A model as `init` is given it, planted: (what `init` is given, how it is made, what the error says).
PLANTED_MODELS = {
    "config-fifo": ("hf", lambda m: os.mkfifo(m / "config.json"), "config.json in folder"),
    "config-dev-zero": ("hf", lambda m: (m / "config.json").symlink_to("/dev/zero"), "config.json in folder"),
    "config-deep": ("hf", lambda m: _deep(m / "config.json"), "hf/config.json is damaged (nested more than"),
    "weights-fifo": ("hf", lambda m: os.mkfifo(m / "pytorch_model.bin"), "pytorch_model.bin in folder"),
    "pt2-fifo": ("m.pt2", lambda m: os.mkfifo(m), "is not a regular file or directory"),
    "pt-dev-zero": ("m.pt", lambda m: m.symlink_to("/dev/zero"), "/dev/zero"),
    "keras-fifo": ("m.keras", lambda m: os.mkfifo(m), "is not a regular file or directory"),
}


def _plant(project: Path, case: str) -> str:
    name, make, _ = PLANTED_MODELS[case]
    target = project / name
    if name == "hf":
        target.mkdir()
        (target / "model.safetensors").write_bytes(b"weights")
        (target / "config.json").write_text('{"model_type": "bert", "architectures": ["BertModel"]}')
        if "config" in case:
            (target / "config.json").unlink()
    make(target)
    return name


@pytest.mark.parametrize("case", sorted(PLANTED_MODELS))
def test_init_and_plan_refuse_a_planted_model_file_with_exit_2(tmp_path: Path, case: str) -> None:
    """`init` makes the check `plan` and `run` make (`fsutil.input_path`, then the bounded, typed reading of a
    model's configuration): a named pipe, a link to /dev/zero or JSON nested 100,000 deep is a clear error (exit 2),
    never a hang (old: init blocked on a pipe or read /dev/zero without end) or an internal error (old: exit 70)."""
    (tmp_path / "pyproject.toml").write_text("")
    model = _plant(tmp_path, case)
    expected = PLANTED_MODELS[case][2]
    extra = ["--input", "x:1,3"] if model.endswith(".pt") else []
    init = trtflow_cli("init", model, *extra, "-o", "r.yaml", cwd=tmp_path, check=2, timeout=HANG)
    assert expected in init.stderr and "Traceback" not in init.stderr, init.stderr
    assert not (tmp_path / "r.yaml").exists()
    inputs = ", inputs: {x: {shape: [1, 3], dtype: float32}}" if model.endswith(".pt") else ""
    (tmp_path / "r.yaml").write_text(f"name: r\nnodes:\n  - name: export\n    stage: export\n"
                                     f"    params: {{model: {model}{inputs}}}\n")
    plan = trtflow_cli("plan", "r.yaml", cwd=tmp_path, check=2, timeout=HANG)
    assert expected in plan.stderr and "Traceback" not in plan.stderr, plan.stderr


def test_a_trust_file_nested_past_python_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """YAML nested 100,000 deep in a committed trust file: `keys list` names the file (old: exit 70)."""
    project = tmp_path / "clone"
    (project / ".git").mkdir(parents=True)
    (project / keys.PROJECT_FILE).write_text("trusted: " + "[" * 100_000 + "]" * 100_000 + "\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(keys.ENV_KEY, raising=False)
    out = trtflow_in_process("keys", "list", cwd=project, check=1)
    assert f"the trust file {project / keys.PROJECT_FILE} nests deeper than" in out.stderr, out.stderr


def test_an_output_named_with_o_replaces_a_link_there_and_never_writes_through_it(tmp_path: Path) -> None:
    """`trtflow schema -o schema.json` where the clone committed schema.json as a link to a file outside: the link
    is replaced by the file (old: the file it named was overwritten)."""
    (tmp_path / "pyproject.toml").write_text("")
    victim = _victim(tmp_path / "home", "bashrc")
    (tmp_path / "schema.json").symlink_to(victim)
    trtflow_in_process("schema", "-o", "schema.json", cwd=tmp_path)
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "schema.json").is_symlink() and '"$schema"' in (tmp_path / "schema.json").read_text()


# ---------------------------------------------------------------------------------------- the module's rules
def test_userfiles_reads_only_a_bounded_regular_file(tmp_path: Path) -> None:
    from trtflow.userfiles import Refused, read_file

    (tmp_path / "ok").write_bytes(b"x" * 10)
    assert read_file(tmp_path / "ok", 10) == b"x" * 10
    with pytest.raises(Refused, match="more than"):
        read_file(tmp_path / "ok", 9)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    (tmp_path / "link").symlink_to(tmp_path / "ok")
    for name in ("fifo", "zero"):
        with pytest.raises(Refused, match="is not a regular file"):
            read_file(tmp_path / name, 1 << 20)
    assert read_file(tmp_path / "link", 10) == b"x" * 10  # a file a recipe names: checked by input_path first
    with pytest.raises(Refused, match="is a symbolic link"):
        read_file(tmp_path / "link", 10, follow=False)
    (tmp_path / "secret").write_bytes(b"s")
    os.chmod(tmp_path / "secret", 0o644)
    with pytest.raises(Refused, match="may be read by others"):
        read_file(tmp_path / "secret", 10, owner_only=True)


def test_userfiles_writes_through_a_random_exclusive_temporary_never_a_link(tmp_path: Path) -> None:
    from trtflow.userfiles import write_file

    victim = _victim(tmp_path / "home", "bashrc")
    target = tmp_path / "out" / "file.txt"
    target.parent.mkdir()
    target.symlink_to(victim)
    write_file(target, "new\n")
    assert victim.read_text() == "precious\n" and not target.is_symlink() and target.read_text() == "new\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["file.txt"]  # no temporary left
    with pytest.raises(FileExistsError):
        write_file(target, "again\n", exclusive=True)
    write_file(tmp_path / "out" / "key", b"k", mode=0o600, exclusive=True)
    assert (tmp_path / "out" / "key").stat().st_mode & 0o777 == 0o600 and target.read_text() == "new\n"
    write_file(tmp_path / "made" / "below" / "f", "x")  # missing folders are made
    assert (tmp_path / "made" / "below" / "f").read_text() == "x"


def test_init_refuses_data_that_plan_would_refuse(tmp_path: Path, tiny_cnn_onnx: Path) -> None:
    """`--data` is checked as plan checks `data:` (old: init wrote a recipe naming a named pipe, and exited 0)."""
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "cnn.onnx").write_bytes(tiny_cnn_onnx.read_bytes())
    os.mkfifo(tmp_path / "samples.npz")
    init = trtflow_cli("init", "cnn.onnx", "--data", "samples.npz", "-o", "r.yaml", cwd=tmp_path, check=2,
                       timeout=HANG)
    assert "--data: " in init.stderr and "is not a regular file or directory" in init.stderr, init.stderr
    assert not (tmp_path / "r.yaml").exists()
