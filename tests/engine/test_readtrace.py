"""What python: code reads, observed by system call (`trtflow.readtrace`): every way of reading a file, in one
observed child (one fork: cheap). Each reader family must show up; calls that read out of sight must make the
run unobserved; a kernel without the mechanism makes every run unobserved (never trusted)."""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import struct
import subprocess
import threading
from pathlib import Path

import pytest

from trtflow import depfile, readtrace

pytestmark = pytest.mark.skipif(readtrace._numbers() is None, reason="seccomp user notification is Linux-only")
X86 = platform.machine() == "x86_64"


def _syscall(number: int, *args: object) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return int(libc.syscall(ctypes.c_long(number), *args))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "p"
    for folder in ("data/one", "data/two", "out"):
        (root / folder).mkdir(parents=True)
    for name in ("openat", "openat2", "open", "native", "mmap", "thread", "sub", "devfd", "procself", "readlink",
                 "written"):
        (root / f"{name}.bin").write_bytes(name.encode() * 100)
    (root / "data" / "one" / "v.txt").write_text("one")
    (root / "data" / "two" / "w.txt").write_text("two")
    (root / "data" / "cur").symlink_to("one")
    (root / "data" / "via").symlink_to("two")
    (root / "last.txt").symlink_to("data/one/v.txt")
    (root / "tool.sh").write_text("#!/bin/sh\nexit 0\n")
    (root / "tool.sh").chmod(0o755)
    return root


def test_every_reader_is_seen_and_links_are_keyed_at_every_component(project: Path, monkeypatch: pytest.MonkeyPatch
                                                                      ) -> None:
    monkeypatch.chdir(project)

    def run() -> dict[str, object]:
        os.close(os.open("openat.bin", os.O_RDONLY))
        how = ctypes.create_string_buffer(struct.pack("QQQ", os.O_RDONLY, 0, 0))
        os.close(_syscall(437, ctypes.c_int(-100), b"openat2.bin", how, ctypes.c_size_t(24)))  # openat2
        if X86:
            os.close(_syscall(2, b"open.bin", ctypes.c_int(os.O_RDONLY)))  # the legacy open
        libc = ctypes.CDLL(None)
        libc.fopen.restype = ctypes.c_void_p
        libc.fclose(ctypes.c_void_p(libc.fopen(b"native.bin", b"rb")))  # native code: stdio
        with open("mmap.bin", "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            m.read(4)
        worker = threading.Thread(target=lambda: Path("thread.bin").read_bytes())
        worker.start()
        worker.join()
        subprocess.run(["cat", "sub.bin"], check=True, stdout=subprocess.DEVNULL)  # another process
        subprocess.run(["./tool.sh"], check=True)  # execve of a project file
        fd = os.open("devfd.bin", os.O_PATH)
        os.close(os.open(f"/dev/fd/{fd}", os.O_RDONLY))  # reopened through /dev/fd
        os.close(os.open("/proc/self/cwd/procself.bin", os.O_RDONLY))  # through /proc/self
        os.readlink("last.txt")
        Path("data/cur/v.txt").read_text()  # a link in the middle
        try:
            os.open("missing.txt", os.O_RDONLY)
        except FileNotFoundError:
            pass
        with open("written.bin", "wb") as f, open("emptied.bin", "w+b") as g:  # written (emptied first), not read
            f.write(b"w")
            g.write(b"w")
            g.seek(0)
            g.read()
        os.chdir("data/via")  # a working folder reached through a link
        Path("w.txt").read_text()
        return {"env": sorted(os.environ)}

    result, reads = readtrace.observed(run, lambda p: True, {"KEPT": "1"})
    assert result == {"env": ["KEPT"]}, result
    assert reads.blind == []
    real = os.path.realpath(project)
    seen = {os.path.relpath(p, real) for p in reads.files if p.startswith(real + os.sep)}
    expected = {"openat.bin", "openat2.bin", "native.bin", "mmap.bin", "thread.bin", "sub.bin", "tool.sh",
                "devfd.bin", "procself.bin", "data/one/v.txt", "missing.txt", "data/two/w.txt"}
    expected |= {"open.bin"} if X86 else set()
    assert expected <= seen, expected - seen
    assert not {"written.bin", "emptied.bin"} & seen
    assert reads.files[os.path.join(real, "missing.txt")] is None
    links = {os.path.relpath(p, real): t for p, t in reads.links.items() if p.startswith(real + os.sep)}
    assert links == {"data/cur": "one", "last.txt": "data/one/v.txt", "data/via": "two"}


@pytest.mark.parametrize("call", ["io_uring_setup", "open_by_handle_at", "chroot"])
def test_a_read_out_of_sight_makes_the_run_unobserved(call: str) -> None:
    def run() -> dict[str, object]:
        params = ctypes.create_string_buffer(120)
        numbers = {"io_uring_setup": (425, 425), "open_by_handle_at": (304, 265), "chroot": (161, 51)}
        number = numbers[call][0 if X86 else 1]
        if call == "io_uring_setup":
            fd = _syscall(number, ctypes.c_uint(1), params)
            if fd >= 0:
                os.close(fd)
        elif call == "open_by_handle_at":
            _syscall(number, ctypes.c_int(-100), params, ctypes.c_int(0))
        else:
            _syscall(number, b"/nonexistent-root")
        return {}

    _, reads = readtrace.observed(run, lambda p: True, {})
    assert any(call in why for why in reads.blind), reads.blind
    deps = depfile.Deps(roots=["/nonexistent"])
    depfile.add_reads(deps, reads, environ={})
    assert depfile.CHANGED in deps.files.values()


def test_without_the_kernel_mechanism_no_run_is_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> int:
        raise OSError(38, "no seccomp user notification here")

    monkeypatch.setattr(readtrace, "install", refuse)
    result, reads = readtrace.observed(lambda: {"ran": True}, lambda p: True, {})
    assert result == {"ran": True}
    assert reads.blind and "no seccomp user notification here" in reads.blind[0]
    deps = depfile.Deps(roots=["/nonexistent"])
    depfile.add_reads(deps, reads, environ={})
    assert [label for label, digest in deps.files.items() if digest == depfile.CHANGED]


def test_the_code_sees_only_named_variables_and_each_is_keyed() -> None:
    environ = {"HOME": "/h", "SECRET_TOKEN": "x", "CALIB": "a.txt", "SCALE": "2",
               "TRTFLOW_PASS_ENV": "SCALE,TRTFLOW_SIGNING_KEY", "TRTFLOW_JOBS": "2", "TRTFLOW_SIGNING_KEY": "k:k",
               "TRTFLOW_ALLOWED_PATHS": "/data"}
    environ["CUDA_VISIBLE_DEVICES"] = "1"  # set by the executor for the node: visible, not keyed
    environ["LANG"] = "C.UTF-8"
    shown = depfile.code_environment(environ, named=["CALIB", "TRTFLOW_SIGNING_KEY"])
    # trtflow's settings only by the allow-list (settings.NODE_SETTINGS): never the signing key, even when named
    assert shown == {"LANG": "C.UTF-8", "CALIB": "a.txt", "SCALE": "2",
                     "TRTFLOW_PASS_ENV": "SCALE,TRTFLOW_SIGNING_KEY", "TRTFLOW_ALLOWED_PATHS": "/data"}
    # the search paths are visible, not keyed: activating a virtual environment rebuilds nothing
    assert depfile.run_environment(shown, environ) == {**shown, "CUDA_VISIBLE_DEVICES": "1", "HOME": "/h"}
    keyed = set(depfile.keyed_env_names(environ, named=["CALIB"]))
    assert {"LANG", "CALIB", "SCALE"} <= keyed
    assert not {"SECRET_TOKEN", "CUDA_VISIBLE_DEVICES", "HOME", "PATH"} & keyed
    assert depfile.named_in({"path": "data/$CALIB", "x": ["${OTHER}"]}) == ["CALIB", "OTHER"]


def test_no_module_runs_a_stage_around_the_observed_worker() -> None:
    """A stage's ``run`` is called in one place, `execution.worker._run_job`, which `run_job` puts in an observed
    child whenever the node has python: code (`trtflow.testing` is the stage author's harness, not a run)."""
    import re

    import trtflow

    package = Path(trtflow.__file__).parent
    calls = re.compile(r"\bstage\.run\(|\.run\(ctx\b")
    callers = sorted(str(p.relative_to(package)) for p in package.rglob("*.py") if calls.search(p.read_text()))
    assert callers == ["execution/worker.py", "testing.py"], callers
    worker = (package / "execution" / "worker.py").read_text()
    assert "readtrace.observed(lambda: _run_job(" in worker


def test_a_child_killed_before_its_result_is_a_clear_failure() -> None:
    import signal

    result, _ = readtrace.observed(lambda: os.kill(os.getpid(), signal.SIGKILL) or {}, lambda p: True, {})
    assert result["status"] == "failed" and "SIGKILL" in result["error"] and result["hint"], result


def test_a_module_loaded_from_its_cached_code_keys_its_source(tmp_path: Path) -> None:
    """``spec_from_file_location`` + ``exec_module`` with a valid ``__pycache__`` entry opens only the .pyc: the
    source is keyed all the same."""
    import importlib.util
    import py_compile

    source = tmp_path / "loaded.py"
    source.write_text("V = 1\n")
    py_compile.compile(str(source), cfile=importlib.util.cache_from_source(str(source)))

    def run() -> dict[str, object]:
        spec = importlib.util.spec_from_file_location("loaded_by_path", source)
        assert spec is not None and spec.loader is not None
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        return {}

    _, reads = readtrace.observed(run, lambda p: True, {})
    deps = depfile.Deps(roots=[str(tmp_path)])
    depfile.add_reads(deps, reads, environ={})
    assert deps.files[os.path.realpath(source)] == depfile.path_digest(source)


def test_the_paths_of_a_vforked_programs_calls_are_its_own(tmp_path: Path) -> None:
    """`subprocess` starts a program by ``vfork``: the child shares its parent's memory until its ``execve``. A
    descriptor of the child's memory kept from then read the parent's memory afterwards, so the paths of the
    program's own calls came out as whatever the parent had at those addresses (seen once in CI: machine code
    recorded as a file name). Every path is read through a descriptor of its own: each file the programs read is
    noted under its name, and nothing that was not a path."""
    files = []
    for i in range(20):
        files.append(tmp_path / f"read-by-cat-{i}.txt")
        files[-1].write_text(str(i))

    def run() -> dict[str, object]:
        for path in files:
            subprocess.run(["cat", str(path)], check=True, capture_output=True)
        return {}

    _, reads = readtrace.observed(run, lambda p: True, {})
    assert not reads.blind, reads.blind
    noted = set(reads.files)
    assert {str(p) for p in files} <= noted, sorted(noted)
    for path in noted:  # every noted path was spelled by a program: printable, absolute, no undecodable bytes
        assert path.startswith("/") and path.isprintable() and path.encode("utf-8"), repr(path)


def test_no_descriptor_of_a_processs_memory_outlives_its_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The property the test above relies on chance to exercise, checked directly: every path is read through a
    descriptor of the caller's memory opened for that read and closed after it, so no read can go through a
    descriptor opened before the caller's ``execve`` (a kept one read the parent's memory after a ``vfork``)."""
    listener = os.open(os.devnull, os.O_RDONLY)
    supervisor = readtrace._Supervisor(listener, lambda p: True)
    paths = [ctypes.create_string_buffer(f"/tmp/path-{i}".encode()) for i in range(3)]
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: str, *args: object, **kwargs: object) -> int:
        if str(path).endswith("/mem"):
            opened.append(str(path))
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    def memory_descriptors() -> list[str]:
        names = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                names.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:  # the listing's own descriptor, closed by now
                pass
        return [n for n in names if n.endswith("/mem")]

    monkeypatch.setattr(os, "open", counting_open)
    try:
        for _ in range(2):  # the same addresses read again: a kept descriptor would be reused here
            for i, buffer in enumerate(paths):
                data = supervisor._read(os.getpid(), ctypes.addressof(buffer), 64)
                assert data.split(b"\0")[0] == f"/tmp/path-{i}".encode()
                assert memory_descriptors() == [], "a descriptor of the caller's memory outlived its read"
        assert len(opened) == 2 * len(paths), opened  # one descriptor per read, none reused
    finally:
        supervisor.close()
