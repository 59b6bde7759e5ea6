"""The one way a model's or a format's own code runs: in a child process denied everything by default.

`run` starts the child (``python -c``, which calls `child_main`) inside bubblewrap (where it is not installed, in
the same sandbox made by `sandbox_unshare`) with the policy of `sandbox_policy`: a file system of its own (the
model's files, the interpreter's and packages' folders read-only, an empty box read-write at ``/box``; no
``/etc/shadow``, no home, no other project), no network, no capabilities, an environment cleared but for variables
named exactly, and a system-call allow-list (every other call fails). Inside, before anything reads the model, the
child also confines itself with **Landlock** (writes only in its box; no TCP; from ABI 6 no signals or abstract
sockets outside), which every process it starts inherits. The child imports and calls
``trtflow_stages.<module>:<function>`` with the JSON request it reads from its standard input, and writes the
function's JSON answer to ``result.json`` in its box.

The parent creates the box, its log and the request through descriptors (the box under a folder it holds open;
the request in a memory file) and never walks them again by name: the answer and the files it takes back
(`run`'s ``take``) are read through the box's descriptor, opened before the child ran, one component at a time
without following links, and must be plain files. `probe` says whether this machine can confine
(`Capability`), and why not: then models that carry code are refused unless the recipe trusts them.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import re
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.stage import RecipeMismatch, StageFailed

from . import sandbox_box

#: Set (to 1) to behave as if this machine could not confine (models that need it are then refused).
DISABLE_ENV = "TRTFLOW_NO_CONFINEMENT"
RESULT_FILE = "result.json"
_RESULT_LIMIT = 4 << 20
_TIMEOUT_S = 1800.0

# --- Landlock (include/uapi/linux/landlock.h); the syscall numbers are the same on every architecture
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_FS = {"execute": 1 << 0, "write_file": 1 << 1, "read_file": 1 << 2, "read_dir": 1 << 3, "remove_dir": 1 << 4,
       "remove_file": 1 << 5, "make_char": 1 << 6, "make_dir": 1 << 7, "make_reg": 1 << 8, "make_sock": 1 << 9,
       "make_fifo": 1 << 10, "make_block": 1 << 11, "make_sym": 1 << 12, "refer": 1 << 13, "truncate": 1 << 14,
       "ioctl_dev": 1 << 15}
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
_FILE_ONLY = _FS["execute"] | _FS["write_file"] | _FS["read_file"] | _FS["truncate"] | _FS["ioctl_dev"]
_READ = _FS["execute"] | _FS["read_file"] | _FS["read_dir"]
_WRITE = (_FS["write_file"] | _FS["read_file"] | _FS["read_dir"] | _FS["remove_dir"] | _FS["remove_file"]
          | _FS["make_dir"] | _FS["make_reg"] | _FS["make_sym"] | _FS["make_fifo"] | _FS["refer"] | _FS["truncate"])
_NET_TCP = (1 << 0) | (1 << 1)  # bind, connect
_SCOPES = (1 << 0) | (1 << 1)  # abstract unix sockets, signals
_PR_SET_NO_NEW_PRIVS = 38

_SYSTEM_READ = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/sys", "/dev")


@dataclass(frozen=True)
class Capability:
    """Whether this machine can confine a child, with the Landlock ABI and, when it cannot, why."""

    available: bool
    abi: int = 0
    reason: str = ""
    maker: str = "bubblewrap"

    def describe(self) -> str:
        if not self.available:
            return f"no confinement here: {self.reason}"
        landlock = f"Landlock ABI {self.abi}" if self.abi else "no Landlock"
        maker = "bubblewrap" if self.maker == "bubblewrap" else "kernel"
        return f"{maker} namespaces (files, network, processes) + seccomp allow-list + {landlock}"


_PROBED: Capability | None = None


def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.restype = ctypes.c_int
    return libc


def _landlock_abi(libc: Any) -> tuple[int, int]:
    """(ABI version, errno): the version is 0 when the kernel has no Landlock or it is disabled."""
    abi = libc.syscall(ctypes.c_long(_SYS_CREATE_RULESET), None, ctypes.c_size_t(0),
                       ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return (int(abi), 0) if abi > 0 else (0, ctypes.get_errno())


def probe() -> Capability:
    """Whether a child can be confined here (asked once per process; the kernel's answer does not change)."""
    global _PROBED
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        return Capability(False, 0, f"{DISABLE_ENV} is set")
    if _PROBED is None:
        _PROBED = _probe()
    return _PROBED


def _probe() -> Capability:
    if not sys.platform.startswith("linux"):
        return Capability(False, 0, f"{platform.system() or sys.platform} has no namespaces, seccomp or Landlock "
                          "(Linux features)")
    try:
        _seccomp_program()
    except (ImportError, OSError, RuntimeError, ValueError) as error:
        return Capability(False, 0, f"no seccomp filter can be built here ({error}): pip install pyseccomp, and "
                          "libseccomp2 from the system's packages")
    try:
        libc = _libc()
    except OSError as error:
        return Capability(False, 0, f"cannot load the C library: {error}")
    abi, _ = _landlock_abi(libc)
    # one empty child under the whole policy: user namespaces may be off (sysctl, AppArmor) or bwrap too old
    import tempfile

    with tempfile.TemporaryDirectory(prefix="trtflow-probe-") as empty:
        box = os.open(empty, sandbox_box.OPEN_DIR)
        try:
            tried = _launch([sys.executable, "-I", "-S", "-c", ""], {}, [], subprocess.DEVNULL, subprocess.PIPE, box,
                            True)
            _, err = tried.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            _kill_group(tried)
            return Capability(False, abi, "the sandbox did not start a child within 60 s")
        finally:
            os.close(box)
    if tried.returncode != 0:
        said = " ".join(err.decode("utf-8", "replace").split())[:300] or f"exit code {tried.returncode}"
        return Capability(False, abi, f"{_maker()} cannot make a sandbox here ({said}): user namespaces may be "
                          "disabled (sysctl kernel.unprivileged_userns_clone=1 or user.max_user_namespaces, or an "
                          "AppArmor profile that allows them, as Ubuntu ships for bwrap: apt-get install bubblewrap)")
    return Capability(True, abi, maker=_maker())


#: ``unshare`` makes the sandbox with the kernel's namespaces directly (`sandbox_unshare`) even where bubblewrap is
#: installed (both apply the same policy; the conformance test runs both).
MAKER_ENV = "TRTFLOW_SANDBOX"


def _maker() -> str:
    """Who makes the sandbox: bubblewrap where installed, else trtflow's own namespace setup."""
    return "unshare" if os.environ.get(MAKER_ENV) == "unshare" or _bwrap() is None else "bubblewrap"


def _bwrap() -> str | None:
    import shutil

    for found in (shutil.which("bwrap"), "/usr/bin/bwrap"):
        if found and os.access(found, os.X_OK):
            return os.path.realpath(found)
    return None


_PROGRAM: bytes | None = None


def _seccomp_program() -> bytes:
    global _PROGRAM
    if _PROGRAM is None:
        from . import sandbox_policy

        _PROGRAM = sandbox_policy.seccomp_program()
    return _PROGRAM


# ---------------------------------------------------------------------------------------------------------
# Applying it (in the child, before anything reads the model)

_CONFINED: Capability | None = None
_TRUSTING = 0


def confined() -> bool:
    """Whether this process has confined itself (`confine` succeeded)."""
    return _CONFINED is not None


@contextmanager
def trusting() -> Iterator[None]:
    """Within it, this unconfined process may read model files that run code: the recipe trusts them
    (``trust_code``), and `trust.decide` said so."""
    global _TRUSTING
    _TRUSTING += 1
    try:
        yield
    finally:
        _TRUSTING -= 1


def guard(shown: str) -> None:
    """Called by every loader of a format that runs its own code, before it reads ``shown``: such a file is read
    only in a confined process or where the recipe trusts it. A failure here is a trtflow bug (a path that did not
    ask `trust.decide`), never a user's."""
    if _CONFINED is None and not _TRUSTING:
        raise RuntimeError(f"refusing to read {shown!r}, which runs its own code, in a process that is neither "
                           "confined nor told to trust it (trtflow_stages.formats.trust.decide was not asked)")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _fail(what: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{what}: {os.strerror(code)}")


def confine(writable: Iterable[Path], readable: Iterable[Path], maker: str = "bubblewrap") -> Capability:
    """Confine this process (and every process it starts) for good, inside the sandbox: Landlock where the kernel
    has it (writes only under ``writable``, reads and executes only under ``readable`` and the system's folders,
    no TCP), no core dumps. OSError when the kernel refuses."""
    global _CONFINED
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        raise OSError(errno.EPERM, f"{DISABLE_ENV} is set")
    capability = Capability(True, _landlock_abi(_libc())[0], maker=maker)
    tasks = os.listdir("/proc/self/task")
    if len(tasks) != 1:  # Landlock and seccomp bind the calling thread only: confine before any thread starts
        raise OSError(errno.EBUSY, f"the process already runs {len(tasks)} threads")
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    libc = _libc()
    abi = capability.abi
    if abi == 0:  # (the namespaces and the allow-list hold without it)
        _CONFINED = capability
        return capability
    handled = _FS_BY_ABI[min(abi, 5)]
    attr = _RulesetAttr(handled, _NET_TCP if abi >= 4 else 0, _SCOPES if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(ctypes.c_long(_SYS_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        raise _fail("landlock_create_ruleset")
    try:
        for path in _existing(readable, _system_read_paths()):
            _allow(libc, ruleset, path, _READ & handled)
        _allow(libc, ruleset, Path(os.devnull), (_FS["write_file"] | _FS["truncate"] | _FS["ioctl_dev"]) & handled)
        for path in _existing(writable):
            _allow(libc, ruleset, path, _WRITE & handled)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise _fail("prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(ctypes.c_long(_SYS_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise _fail("landlock_restrict_self")
    finally:
        os.close(ruleset)
    _CONFINED = capability
    return capability


def _existing(*groups: Iterable[Path | str]) -> list[Path]:
    seen: dict[str, Path] = {}
    for group in groups:
        for item in group:
            if item and os.path.exists(item):
                seen.setdefault(os.path.realpath(item), Path(os.path.realpath(item)))
    return list(seen.values())


def _allow(libc: Any, ruleset: int, path: Path, access: int) -> None:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        if not os.path.isdir(path):
            access &= _FILE_ONLY
        rule = _PathBeneath(access, fd)
        if libc.syscall(ctypes.c_long(_SYS_ADD_RULE), ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                        ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            raise _fail(f"landlock_add_rule({path})")
    finally:
        os.close(fd)


def _system_read_paths() -> list[str]:
    """What any Python program here reads: the system's folders, the interpreter, its libraries and packages."""
    paths = list(_SYSTEM_READ) + _proc_paths()
    paths += [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable)]
    paths += [p for p in sys.path if p and os.path.isdir(p)]
    paths += [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    import trtflow
    import trtflow_stages

    paths += [os.path.dirname(trtflow.__file__), os.path.dirname(trtflow_stages.__file__)]
    return paths


def _proc_paths() -> list[str]:
    """``/proc`` without other processes' folders (their environment may hold credentials): this process's own
    folder and the machine-wide entries (cpuinfo, meminfo, sys, ...)."""
    own = str(os.getpid())
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    return [f"/proc/{name}" for name in names
            if name == own or not (name.isdigit() or name in ("self", "thread-self"))]


# ---------------------------------------------------------------------------------------------------------
# The parent side

_CHILD = ("import sys; from trtflow_stages.formats.confinement import child_main; sys.exit(child_main(sys.argv[1:]))")


def run(function: str, request: Mapping[str, Any], box: Path, readable: Sequence[Path], log: Any = None,
        timeout: float = _TIMEOUT_S, what: str = "the conversion", confine_child: bool = True,
        take: Mapping[str, Path] | None = None, dir_fd: int | None = None) -> dict[str, Any]:
    """Call ``function`` (``trtflow_stages.<module>:<name>``, taking and returning JSON) in a child confined to
    ``box`` (made empty; it sees ``readable`` read-only besides the interpreter's folders); its answer, or
    StageFailed. ``take``: files of the box (relative names) to copy to targets outside, plain files only.

    ``dir_fd``: a descriptor of the folder that holds the box (``box.name`` under it; ``box`` then only names it
    in messages); without it that folder is opened once (`sandbox_box.open_folder`: from the held descriptor when
    it is a node's ``/proc/<pid>/fd/<n>`` scratch path, else by path, not following a link as its last component).
    ``confine_child=False`` runs the same child unconfined (a model the recipe trusts with ``trust_code``)."""
    if not function.startswith("trtflow_stages.") or ":" not in function:
        raise ValueError(f"not a trtflow_stages function: {function!r}")
    box = box.absolute()
    parent = os.dup(dir_fd) if dir_fd is not None else sandbox_box.open_folder(box.parent)
    box_fd = log_fd = -1
    try:
        box_fd = sandbox_box.fresh_box(parent, box.name)
        log_fd = sandbox_box.fresh_file(parent, f"{box.name}.log")
        log_file = box.with_name(f"{box.name}.log")
        spec = {"function": function, "request": dict(request), "confine": confine_child, "maker": _maker(),
                "readable": [str(Path(p).absolute()) for p in readable]}
        code = _run_child(spec, box_fd, log_fd, readable, timeout)
        tail = sandbox_box.tail(log_fd, 6000)
        if log is not None and tail:
            log.info("%s (child process): %s", what, tail)
        if code is None:
            raise StageFailed(f"{what} took more than {timeout:.0f} s and was stopped", hint=f"its log: {log_file}")
        answer = read_result(box_fd)
        if code < 0 and not answer:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            raise StageFailed(f"{what} died of {name}", hint=f"its log: {log_file}")
        if "error" in answer or code != 0 or not answer:
            _failed(answer, code, tail, sandbox_box.tail(log_fd, 1 << 18), confine_child, what, log_file)
        for name, target in (take or {}).items():
            sandbox_box.take(box_fd, name, target)
        return answer
    finally:
        for fd in (log_fd, box_fd, parent):
            if fd >= 0:
                os.close(fd)


def _failed(answer: Mapping[str, Any], code: int, tail: str, log_text: str, confine_child: bool, what: str,
            log_file: Path) -> None:
    message = _printable(str(answer.get("error") or _last_lines(tail) or f"exit code {code}"))
    hint = str(answer.get("hint") or "")
    denied = _denied(message) or _denied(_printable(log_text)) if confine_child else None
    if denied is not None:
        hint = (f"the model's code tried something the confinement forbids ({denied}): writing outside its "
                "scratch folder, reading private files or using the network; if you trust this file as a "
                "program, set trust_code: true on the node to run it unconfined" + (f"; {hint}" if hint else ""))
    # a mistake in what the recipe declares keeps its kind (exit 2), as in the node's own process; a forged
    # flag from the model's code can change no more than that code
    kind = RecipeMismatch if answer.get("mismatch") is True and denied is None else StageFailed
    raise kind(f"{what} failed: {message}", hint=hint or f"its log: {log_file}")


def _run_child(spec: dict[str, Any], box_fd: int, log_fd: int, readable: Sequence[Path],
               timeout: float) -> int | None:
    """Start the child (its request on its standard input, a memory file), wait; its exit code, None if it timed
    out. Whatever happens, nothing it started outlives it."""
    request = os.memfd_create("trtflow-request", os.MFD_CLOEXEC)
    sources: list[tuple[int, str]] = []
    try:
        os.write(request, json.dumps(spec).encode("utf-8"))
        os.lseek(request, 0, os.SEEK_SET)
        if spec["confine"]:
            for path in readable:  # (opened now: what the child sees is what was named, whatever moves later)
                sources.append((os.open(Path(path).absolute(), os.O_PATH | os.O_CLOEXEC), str(Path(path).absolute())))
        proc = _launch([sys.executable, "-c", _CHILD], spec, sources, request, log_fd, box_fd, spec["confine"])
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:  # (a timeout, Ctrl-C)
            _kill_group(proc)
    finally:
        for fd, _ in sources:
            os.close(fd)
        os.close(request)


def _launch(command: list[str], spec: Mapping[str, Any], sources: Sequence[tuple[int, str]], stdin: Any,
            stdout: Any, box_fd: int, confine_child: bool) -> subprocess.Popen[bytes]:
    """The child process: under bubblewrap when ``confine_child`` (else plain, in its box); every launch of a
    model's code goes through here."""
    from . import sandbox_policy

    if not confine_child:
        home = os.readlink(f"/proc/self/fd/{box_fd}")
        return subprocess.Popen(command, stdin=stdin, stdout=stdout, stderr=subprocess.STDOUT,
                                env=sandbox_policy.child_environment(home), cwd=f"/proc/self/fd/{box_fd}",
                                pass_fds=(box_fd,), start_new_session=True, close_fds=True)
    fds: list[int] = []
    try:
        def memory(data: bytes) -> int:
            fd = os.memfd_create("trtflow-sandbox", 0)
            fds.append(fd)
            os.write(fd, data)
            os.lseek(fd, 0, os.SEEK_SET)
            return fd

        seccomp = memory(_seccomp_program())
        data = [(memory(content), path) for path, content in sandbox_policy.identity_files().items()]
        env = sandbox_policy.child_environment(sandbox_policy.BOX)
        bwrap = _bwrap()
        if _maker() == "bubblewrap" and bwrap is not None:
            args = sandbox_policy.bwrap_arguments(box_fd, sources, data, seccomp, env)
            full = [bwrap, *args, "--", *command]
            keep = (*fds, box_fd, *(fd for fd, _ in sources))
        else:
            plan, opened = sandbox_policy.unshare_plan(box_fd, sources, data, seccomp, env, command)
            fds += opened
            plan_fd = memory(json.dumps(plan).encode("utf-8"))
            setup = Path(__file__).with_name("sandbox_unshare.py")
            full = [sys.executable, "-I", "-S", str(setup), str(plan_fd)]
            keep = (*fds, box_fd, *(fd for fd, _ in sources))
        return subprocess.Popen(full, stdin=stdin, stdout=stdout,
                                stderr=subprocess.STDOUT if stdout is not subprocess.PIPE else subprocess.PIPE,
                                env={}, pass_fds=keep, start_new_session=True, close_fds=True)
    finally:
        for fd in fds:
            os.close(fd)


def checked(answer: Mapping[str, Any], fields: Mapping[str, type | tuple[type, ...]], what: str) -> dict[str, Any]:
    """The fields of a child's answer that have the expected types (the child ran the model's code, so its answer
    is checked like any input): StageFailed for a required field (``fields``) that is missing or of another type."""
    for name, kind in fields.items():
        if not isinstance(answer.get(name), kind):
            raise StageFailed(f"{what}: the child process answered without a valid {name!r}",
                              hint="the model's code may have tampered with the conversion; see the node's log")
    return dict(answer)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _last_lines(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return " ".join(" ".join(lines[-3:]).split())[-500:]


_DENIED = re.compile(r"[^\n]{0,160}(?:Permission denied|Operation not permitted|PermissionError)[^\n]{0,160}")


def _denied(text: str) -> str | None:
    """The first line of ``text`` that says the kernel denied something (shortened), or None."""
    found = _DENIED.search(text)
    if found is None:
        return _hidden(text)
    line = found.group(0)
    errors = list(re.finditer(r"\w+(?:Error|Exception): ", line))  # from the error's name, if the line has one
    return " ".join(line[errors[-1].start() if errors else 0:].split())[:300]


_MISSING = re.compile(r"(/[^\s'\"<>:]+)[^\n]{0,80}(?:No such file or directory|FileNotFoundError)|"
                      r"(?:No such file or directory|FileNotFoundError)[^\n]{0,40}?(/[^\s'\"<>:]+)")


def _hidden(text: str) -> str | None:
    """A path the child found missing that exists here (or whose folder does), in no folder the child sees: it is
    outside the child's file system (or None)."""
    from . import sandbox_policy

    seen = ("/usr", "/etc", "/sys", "/proc", "/dev", sandbox_policy.BOX, *sandbox_policy.library_folders())
    for found in _MISSING.finditer(text):
        path = found.group(1) or found.group(2)
        if (os.path.lexists(path) or os.path.isdir(os.path.dirname(path))) and not any(
                path == folder or path.startswith(folder.rstrip("/") + "/") for folder in seen):
            return f"{path} is outside its sandbox (No such file or directory)"
    return None


def read_result(box_fd: int) -> dict[str, Any]:
    """The child's answer in the box (held open): a plain file, at most a few MiB of JSON; {} when absent."""
    try:
        data = sandbox_box.read_plain(box_fd, RESULT_FILE, _RESULT_LIMIT)
    except FileNotFoundError:
        return {}
    except OSError as error:
        return {"error": f"its answer is unreadable: {error}"}
    try:
        answer = _printable(json.loads(data))
    except (ValueError, RecursionError):
        return {"error": "its answer is not JSON"}
    return answer if isinstance(answer, dict) else {"error": "its answer is not a JSON object"}


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _printable(value: Any) -> Any:
    """``value`` with control characters removed from every string (the answer is shown on terminals: no escape
    sequences from the model's code)."""
    if isinstance(value, str):
        return _CONTROL.sub("", value)
    if isinstance(value, list):
        return [_printable(v) for v in value]
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------------------------------------------
# The child side


def _die_with_parent() -> None:
    """Be killed if the node's process dies (kill -9 of trtflow), so no child keeps working unwatched (under
    bubblewrap, its --die-with-parent does the same)."""
    try:
        _libc().prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except OSError:
        return


def child_main(argv: Sequence[str]) -> int:
    """Entry point of the child: read the request (standard input), confine, call the function, write its answer
    (or the error) to result.json in its box (its working folder)."""
    import importlib
    import traceback

    spec = json.loads(sys.stdin.buffer.read(64 << 20))
    box = Path.cwd()
    _die_with_parent()
    answer: dict[str, Any]
    try:
        if spec["confine"]:
            capability = confine([box], [Path(p) for p in spec["readable"]], str(spec.get("maker", "")))
            print(f"trtflow: confined: {capability.describe()}", file=sys.stderr, flush=True)
    except OSError as error:
        answer = {"error": f"the child process could not confine itself: {error}",
                  "hint": "set trust_code: true on the node to convert this model unconfined, if you trust it"}
    else:
        module, _, name = spec["function"].partition(":")
        try:
            with trusting() if not spec["confine"] else nullcontext():
                answer = getattr(importlib.import_module(module), name)(spec["request"])
        except StageFailed as failed:
            answer = {"error": failed.message, "hint": failed.hint or "",
                      "mismatch": isinstance(failed, RecipeMismatch)}
        except Exception as error:  # the model's own code can raise anything: report it, with the traceback
            traceback.print_exc()
            answer = {"error": f"{type(error).__name__}: {' '.join(str(error).split())[:500]}"}
    (box / RESULT_FILE).write_text(json.dumps(answer, default=str), encoding="utf-8")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
