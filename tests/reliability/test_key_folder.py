"""The user's key folder ($XDG_CONFIG_HOME/trtflow/keys) is trtflow's own: opened component by component below the
folder the user named, never through a link, this user's and writable by nobody else; what is in it is read and
written relative to that descriptor (`trtflow.userfiles.own_folder`, `trtflow.keys.key_folder`). Through the
CLI: a link planted at the key folder (or at trtflow/) leaves what it points at alone (its mode, its contents) and is
refused with the fix; a key folder others may write is refused with the fix."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.plugins import subprocess_env, write_plugin_distribution
from trtflow import keys

CHAIN = "name: chain\nnodes:\n  - {name: a, stage: synth, params: {text: a, size: 300}}\n"


def _project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    (project / "chain.yaml").write_text(CHAIN)
    env = subprocess_env(write_plugin_distribution(tmp_path / "plugins"))
    env.update(XDG_CONFIG_HOME=str(tmp_path / "xdg"), TRTFLOW_STORE=str(tmp_path / "store"), COLUMNS="200")
    env.pop(keys.ENV_KEY, None)
    env.pop(keys.ENV_KEY_FILE, None)
    return project, env


def _cli(project: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trtflow.cli", *args], cwd=project, env=env, capture_output=True,
                          text=True, timeout=600)


def _snapshot(folder: Path) -> tuple[int, dict[str, bytes]]:
    return (stat.S_IMODE(folder.stat().st_mode),
            {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()})


@pytest.mark.parametrize("linked", ["trtflow/keys", "trtflow"])
def test_a_link_at_the_key_folder_is_refused_and_what_it_names_is_left_alone(tmp_path: Path, linked: str) -> None:
    project, env = _project(tmp_path)
    victim = tmp_path / "victimdir"
    victim.mkdir(mode=0o755)
    victim.chmod(0o755)
    (victim / "notes.txt").write_text("precious\n")
    link = tmp_path / "xdg" / linked
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim)
    before = _snapshot(victim)
    for args in (("run", "chain.yaml"), ("keys", "create", "mine"), ("keys", "list")):
        proc = _cli(project, env, *args)
        assert proc.returncode not in (0, 70), f"{args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        said = proc.stdout + proc.stderr  # run reports a node's error in its summary; other commands on stderr
        assert f"{link} is a symbolic link" in said and f"rm {link}" in said and "Traceback" not in said, said
        assert _snapshot(victim) == before, args  # not chmod-ed, no key, no secret, no default written into it
    assert link.is_symlink()
    link.unlink()  # removed, as the error says: trtflow makes its own folder, private
    proc = _cli(project, env, "run", "chain.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    folder = tmp_path / "xdg" / "trtflow" / "keys"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and (folder / "default").is_file()
    assert any(name.endswith(".key") for name in os.listdir(folder))


@pytest.mark.parametrize("which", ["trtflow/keys", "trtflow/keys/public", "trtflow"])
def test_a_key_folder_others_may_write_is_refused_with_the_fix(tmp_path: Path, which: str) -> None:
    project, env = _project(tmp_path)
    proc = _cli(project, env, "run", "chain.yaml")  # makes the key store
    assert proc.returncode == 0, proc.stdout + proc.stderr
    folder = tmp_path / "xdg" / which
    folder.chmod(0o775)
    keys_folder = tmp_path / "xdg" / "trtflow" / "keys"
    before = sorted(os.listdir(keys_folder))
    for args in (("run", "chain.yaml"), ("keys", "list")):
        proc = _cli(project, env, *args)
        assert proc.returncode not in (0, 70), f"{args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        said = proc.stdout + proc.stderr
        assert f"{folder} may be written by others (mode 775)" in said, said
        assert f"chmod go-w {folder}" in said and "Traceback" not in said, said
    assert stat.S_IMODE(folder.stat().st_mode) == 0o775 and sorted(os.listdir(keys_folder)) == before
    folder.chmod(0o755)  # the fix the error gives: trtflow runs again, and makes its key folder private again
    proc = _cli(project, env, "run", "chain.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert stat.S_IMODE(keys_folder.stat().st_mode) == 0o700


def test_a_readable_key_folder_is_made_private_through_its_descriptor(tmp_path: Path) -> None:
    """A key folder of this user others may read (not write) is set to 0700 (``fchmod``), as before."""
    project, env = _project(tmp_path)
    folder = tmp_path / "xdg" / "trtflow" / "keys"
    folder.mkdir(parents=True, mode=0o755)
    folder.chmod(0o755)
    proc = _cli(project, env, "keys", "create", "mine")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "mine.key").stat().st_mode) == 0o600


def test_only_the_key_module_touches_the_key_folder_and_the_environment_key() -> None:
    """An audit: the key folder's paths (`keys_dir`, `public_dir`, `config_dir`) and the environment's signing key
    are used only by `trtflow.keys` (which opens the folder through `key_folder` and reads the key as
    `take_signing_key` took it); another module that names them goes around the mechanism."""
    import ast

    import trtflow

    root = Path(trtflow.__file__).parent.parent
    allowed = {("trtflow/storage/verified.py", "keys_dir"): "secret_path: a path shown and a memo's key, never opened"}
    offenders = []
    for path in [*(root / "trtflow").rglob("*.py"), *(root / "stages").rglob("*.py")]:
        rel = str(path.relative_to(root))
        if rel in ("trtflow/keys.py", "trtflow/settings.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name in ("keys_dir", "public_dir", "config_dir", "own_folder", "_private_folder") and \
                    (rel, name) not in allowed and rel != "trtflow/userfiles.py":
                offenders.append(f"{rel}:{node.lineno}: {name}")
            if (isinstance(node, ast.Constant) and node.value == "TRTFLOW_SIGNING_KEY") or name in ("SIGNING_KEY",
                                                                                                  "ENV_KEY"):
                offenders.append(f"{rel}:{node.lineno}: the signing key's variable")
    # keys list compares a signer's source with the variable's name (a label): it reads no environment
    assert [o.split(":")[0] for o in offenders] == ["trtflow/keys_cli.py"], offenders
