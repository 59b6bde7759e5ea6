"""The sandbox over its whole surface (formats.confinement, formats.sandbox_policy): a hostile `.pt2` runs a battery
of every family of system call that could change or reveal something outside (tests/stages/sandbox_battery.py)
inside the real sandbox, through a real format reader; any that succeeds fails the test. And nothing launches a
model's code another way."""

from __future__ import annotations

import ast
import json
import os
import stat
from pathlib import Path

import pytest

from tests.stages import sandbox_battery
from trtflow.stage import StageFailed
from trtflow_stages.formats import confinement, sandbox_box, sandbox_policy

STAGES = Path(__file__).resolve().parents[2] / "stages"
needs_confinement = pytest.mark.skipif(not confinement.probe().available,
                                       reason=f"this machine cannot confine: {confinement.probe().reason}")
#: Variables a parent may hold that must never reach a model's code (no prefix passes, only exact names).
_PLANTED = {"TF_VAR_db_password": "hunter2", "TF_TOKEN_app_terraform_io": "token", "AWS_SECRET_ACCESS_KEY": "k",
            "SSH_AUTH_SOCK": "/tmp/agent.sock", "GITHUB_TOKEN": "ghp", "OMP_PROC_BIND": "true", "TORCH_HOME": "/x",
            "LD_PRELOAD": "/tmp/evil.so", "PYTHONSTARTUP": "/tmp/evil.py"}


def _facts(path: Path) -> tuple:
    st = os.lstat(path)
    try:
        xattrs = sorted(os.listxattr(path, follow_symlinks=False))
    except OSError:
        xattrs = []
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns, st.st_nlink, path.read_bytes(), xattrs


@pytest.fixture(scope="module", params=["bubblewrap", "unshare"])
def battery(request, tmp_path_factory):
    """The battery's report, run once per maker of the sandbox (bubblewrap; trtflow's own namespace setup, used
    where bubblewrap is missing), one child each, with the victims' facts before and after."""
    maker = request.param
    saved_maker = os.environ.pop(confinement.MAKER_ENV, None)
    if maker == "unshare":
        os.environ[confinement.MAKER_ENV] = "unshare"
    try:
        capability = confinement._probe()
        if not capability.available or capability.maker != maker:
            pytest.skip(f"this machine cannot confine with {maker}: {capability.reason}")
        yield _battery(tmp_path_factory.mktemp(f"sandbox-{maker}"))
    finally:
        os.environ.pop(confinement.MAKER_ENV, None)
        if saved_maker is not None:
            os.environ[confinement.MAKER_ENV] = saved_maker


def _battery(base: Path) -> dict:
    home = base / "victim_home"
    (home / ".ssh").mkdir(parents=True)
    victims = [home / ".ssh" / "id_rsa", home / ".bashrc", base / "other_project.onnx"]
    for victim in victims:
        victim.write_text(f"secret of {victim.name}\n")
        victim.chmod(0o600)
        try:
            os.setxattr(victim, "user.trtflow", b"kept")
        except OSError:
            pass
    before = {v: _facts(v) for v in victims}
    model = sandbox_battery.battery_pt2(base / "hostile.pt2", [str(v) for v in victims], [os.getpid(), os.getppid()])
    model_before = _facts(model)
    saved = {name: os.environ.get(name) for name in _PLANTED}
    os.environ.update(_PLANTED)
    real_run_child = confinement._run_child

    def co_writer_wins(*args, **kwargs):
        """A second writer of the scratch folder swaps the box and its log for links once they are made."""
        (base / "box").rename(base / "box.moved")
        (base / "box").symlink_to(home / ".ssh")
        (base / "box.log").rename(base / "box.log.moved")
        (base / "box.log").symlink_to(home / ".bashrc")
        return real_run_child(*args, **kwargs)

    confinement._run_child = co_writer_wins
    try:
        answer = confinement.run("trtflow_stages.formats.describe:program_entries_in_child",
                                 {"source": str(model)}, base / "box", [model], timeout=300, what="the battery")
    finally:
        confinement._run_child = real_run_child
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    report = json.loads((base / "box.moved" / sandbox_battery.REPORT).read_text())
    return {"report": report, "before": before, "after": {v: _facts(v) for v in victims}, "answer": answer,
            "model": (model_before, _facts(model)), "base": base, "home": home}


def _entries(battery, family: str) -> list[dict]:
    return [e for e in battery["report"] if e["family"] == family]


@needs_confinement
def test_no_call_of_the_battery_changes_or_reveals_anything(battery):
    succeeded = [f"{e['family']}: {e['call']} -> {e['detail']}" for e in battery["report"] if e["ok"] is True]
    assert succeeded == []
    # what the allow-list denies fails in the filter itself (EPERM, ENOSYS), not later in the kernel's checks
    not_filtered = [f"{e['call']}: {e['errno']}" for e in battery["report"]
                    if e.get("raw") and e["errno"] not in ("EPERM", "ENOSYS")]
    assert not_filtered == []
    families = {e["family"] for e in battery["report"]}
    assert {"metadata", "write", "links", "devices", "mounts", "namespaces", "ptrace", "signals", "sockets",
            "keyrings", "bpf", "io_uring", "perf", "kernel", "reads", "descriptors", "environment"} <= families
    assert len(battery["report"]) > 300


@needs_confinement
def test_files_outside_are_untouched_and_secrets_are_not_there(battery):
    """Also with the box and its log swapped for links to the victim's files while the run started: the child
    wrote, and the parent read, through the descriptors held from their creation."""
    assert battery["after"] == battery["before"]
    assert sorted(p.name for p in (battery["home"] / ".ssh").iterdir()) == ["id_rsa"]
    assert battery["answer"]["inputs"]["features"]["dynamic_axes"] == {"0": "batch"}
    log = (battery["base"] / "box.log.moved").read_text()
    assert "namespaces (files, network, processes) + seccomp allow-list" in log
    assert battery["model"][0] == battery["model"][1]
    reads = {e["call"].removeprefix("read "): e for e in _entries(battery, "reads")}
    for secret in ("/etc/shadow", "/root/.ssh", "/etc/ssh", *(str(v) for v in battery["before"])):
        assert reads[secret]["errno"] == "ENOENT", secret  # not denied: absent from the child's file system


@needs_confinement
def test_the_child_inherits_no_descriptor_environment_or_capability(battery):
    fds = _entries(battery, "descriptors")[0]["detail"]
    assert fds["0"].startswith("/memfd:trtflow-request")
    assert fds["1"] == fds["2"] and fds["1"].endswith("box.log.moved")
    visible = ("/box", "/usr", "/proc/", "/dev/", "pipe:", "anon_inode:", "/memfd:",
               *sandbox_policy.library_folders(), str(battery["base"] / "hostile.pt2"))
    assert {fd: target for fd, target in fds.items() if fd not in "012" and not target.startswith(visible)} == {}
    names = set(_entries(battery, "environment")[0]["detail"])
    assert not names & set(_PLANTED)
    assert names <= {*sandbox_policy.KEEP_ENV, *sandbox_policy.child_environment("/box"), "PWD"}
    uid, euid, capabilities = _entries(battery, "identity")[0]["detail"]
    assert uid == euid == sandbox_policy.CHILD_ID and int(capabilities, 16) == 0


def test_every_child_that_runs_a_models_code_is_launched_by_confinement():
    """Only formats.confinement (and the namespace setup it runs) starts processes among the format readers and
    export; every function that runs
    in a child (``*_in_child``) is reached only through confinement.run, by name."""
    launches = ("subprocess", "multiprocessing", "os.fork", "os.system", "os.popen", "os.spawn", "os.exec",
                "os.posix_spawn", "pty.spawn", "concurrent.futures.ProcessPoolExecutor")
    found = []
    for path in [*sorted((STAGES / "formats").glob("*.py")), *sorted((STAGES / "exporting").glob("*.py")),
                 STAGES / "export.py"]:
        if path.name in ("confinement.py", "sandbox_unshare.py"):  # (the sandbox: its launcher, its setup)
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
                found += [f"{path.name}:{node.lineno} imports {n}" for n in names if n and n.startswith(launches)]
            elif isinstance(node, ast.Call) and ast.unparse(node.func).startswith(launches):
                found.append(f"{path.name}:{node.lineno} calls {ast.unparse(node.func)}")
            elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("_in_child"):
                found.append(f"{path.name}:{node.lineno} calls {ast.unparse(node.func)} in this process")
    assert found == []
    sources = [text for path in STAGES.rglob("*.py") if "confinement.run(" in (text := path.read_text("utf-8"))]
    runs = [node for text in sources for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "confinement.run"]
    assert len(runs) >= 5 and all("_in_child" in ast.unparse(call.args[0]) for call in runs)
    # in confinement itself, one place starts a process
    source = (STAGES / "formats" / "confinement.py").read_text(encoding="utf-8")
    assert source.count("subprocess.Popen(") == 2 and source.count("def _launch(") == 1
    users = [p.name for p in STAGES.rglob("*.py") if "sandbox_unshare.py" in p.read_text("utf-8")]
    assert sorted(users) == ["confinement.py", "sandbox_unshare.py"]


def test_the_allow_list_names_no_call_that_reaches_outside():
    allowed = set(sandbox_policy.allowed_syscalls())
    forbidden = {"chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat", "utime",
                 "utimes", "utimensat", "futimesat", "setxattr", "lsetxattr", "fsetxattr", "removexattr",
                 "lremovexattr", "fremovexattr", "mknod", "mknodat", "mount", "umount2", "pivot_root", "chroot",
                 "unshare", "setns", "clone3", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "socket",
                 "socketpair", "connect", "bind", "keyctl", "add_key", "request_key", "bpf", "io_uring_setup",
                 "io_uring_enter", "perf_event_open", "fanotify_init", "open_by_handle_at", "userfaultfd",
                 "pidfd_getfd", "seccomp", "setuid", "capset", "init_module", "kexec_load", "reboot"}
    assert allowed & forbidden == set()


def _plain_box(tmp_path: Path) -> int:
    (tmp_path / "box" / "work" / "out").mkdir(parents=True)
    (tmp_path / "box" / "work" / "out" / "model.onnx").write_bytes(b"made by the child")
    return os.open(tmp_path / "box", sandbox_box.OPEN_DIR)


def test_the_parent_takes_back_only_plain_files_through_the_descriptors_it_held(tmp_path):
    """The hand-back, without a child: a folder on the way swapped for a link, a link or hard link as the file,
    the whole box moved and replaced by a link, and a target that is a link: nothing outside is read or written."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "model.onnx").write_bytes(b"another project's model")
    victim = tmp_path / "authorized_keys"
    victim.write_bytes(b"ssh-ed25519 AAAA user")
    box = _plain_box(tmp_path)
    try:
        (tmp_path / "box").rename(tmp_path / "box.moved")  # the box's name now leads elsewhere: still the box
        (tmp_path / "box").symlink_to(private)
        sandbox_box.take(box, "work/out/model.onnx", tmp_path / "taken.onnx")
        assert (tmp_path / "taken.onnx").read_bytes() == b"made by the child"
        with pytest.raises(StageFailed, match="cannot write"):  # a target that is a link is not followed
            (tmp_path / "linked_target.onnx").symlink_to(victim)
            sandbox_box.take(box, "work/out/model.onnx", tmp_path / "linked_target.onnx")
        out = tmp_path / "box.moved" / "work" / "out"
        out.rename(tmp_path / "box.moved" / "work" / "out.old")
        out.symlink_to(private)  # the child swaps its output folder for a link
        with pytest.raises(StageFailed, match="no plain work/out/model.onnx"):
            sandbox_box.take(box, "work/out/model.onnx", tmp_path / "stolen.onnx")
        out.unlink()
        out.mkdir()
        (out / "model.onnx").symlink_to(private / "model.onnx")
        with pytest.raises(StageFailed, match="no plain"):
            sandbox_box.take(box, "work/out/model.onnx", tmp_path / "stolen.onnx")
        (out / "model.onnx").unlink()
        os.link(victim, out / "model.onnx")
        with pytest.raises(StageFailed, match="other than a plain file"):
            sandbox_box.take(box, "work/out/model.onnx", tmp_path / "stolen.onnx")
        with pytest.raises(OSError, match="not a plain name"):
            sandbox_box.read_plain(box, "../private/model.onnx", 100)
    finally:
        os.close(box)
    assert not (tmp_path / "stolen.onnx").exists() and victim.read_bytes() == b"ssh-ed25519 AAAA user"


def test_a_fresh_box_replaces_what_is_there_without_following_links(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("kept")
    parent = os.open(tmp_path, sandbox_box.OPEN_DIR)
    try:
        (tmp_path / "box").symlink_to(victim)
        (tmp_path / "box.log").symlink_to(victim / "keep.txt")
        box = sandbox_box.fresh_box(parent, "box")
        log = sandbox_box.fresh_file(parent, "box.log")
        os.write(log, b"the child's output")
        os.close(log)
        assert sorted(os.listdir(box)) == ["cache", "home", "tmp"]
        os.close(box)
        (tmp_path / "box" / "tmp" / "old").mkdir()
        os.close(sandbox_box.fresh_box(parent, "box"))
        assert sorted(os.listdir(tmp_path / "box")) == ["cache", "home", "tmp"]
    finally:
        os.close(parent)
    assert (victim / "keep.txt").read_text() == "kept" and sorted(os.listdir(victim)) == ["keep.txt"]
    assert not (tmp_path / "box").is_symlink() and (tmp_path / "box.log").read_text() == "the child's output"
