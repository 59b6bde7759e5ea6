"""A child process the kernel confines, for work that runs a model file's own program (`trust` says which).

Linux only, through two kernel features a process can apply to itself without privileges (after
``prctl(PR_SET_NO_NEW_PRIVS)``), called with ctypes (the ``landlock`` package on PyPI has neither network rules
nor scopes):

- **Landlock** (ABI 4 or later: Linux 6.7+): the child may write, create, rename and delete only inside its box (a
  folder in the node's scratch space); it may read and execute only the system's and Python's folders (``/usr``,
  ``/lib``, ``/etc``, ``/sys``, ``/dev``, the interpreter's prefixes, ``sys.path``), ``/proc`` without other
  processes' folders (their environments may hold credentials), and the model file; it may not bind or
  connect TCP sockets. From ABI 6 (Linux 6.12) it may not signal processes outside its domain nor reach
  abstract unix sockets. Landlock also keeps it from ptrace-ing any process outside its domain.
- **seccomp**: ``socket()`` fails (every family: no UDP, no unix sockets to a daemon, no raw sockets) and
  ``io_uring_setup`` fails (its operations would bypass the socket filter).

Both are inherited by every process the child starts and cannot be lifted. The child also gets a new session (no
terminal), an environment without credentials (only the variables that locate libraries and set threads),
``HOME`` and ``TMPDIR`` inside its box, no core dumps, and no file descriptors of its parent besides
stdin (``/dev/null``) and a log file.

`run` starts the child (``python -c``, which calls `child_main`): it confines itself first, then imports and
calls a function named ``trtflow_stages.<module>:<function>`` with a JSON request and writes the function's JSON
answer to ``result.json`` in its box. The parent reads that answer (a regular file, bounded) and the files it
asks for; it never loads the model. `probe` says whether this machine can confine (`Capability`), and why not.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import re
import signal
import struct
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.stage import RecipeMismatch, StageFailed

#: Landlock ABI that the confinement needs: 4 is the first with network rules (Linux 6.7).
MIN_ABI = 4
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
_PR_SET_NO_NEW_PRIVS, _PR_GET_SECCOMP, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 21, 22, 2

# --- seccomp: per architecture, the audit arch value and the numbers of socket and io_uring_setup
_ARCH = {"x86_64": (0xC000003E, 41, 425, True), "aarch64": (0xC00000B7, 198, 425, False)}
_SYSTEM_READ = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/sys", "/dev")
#: Environment variables the child keeps (names, or prefixes ending in ``_``): where libraries are, threads.
_KEEP_ENV = ("PATH", "LANG", "LANGUAGE", "TZ", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "LC_", "OMP_",
             "MKL_", "OPENBLAS_", "KMP_", "TF_", "KERAS_BACKEND", "TORCH_", "PYTORCH_", "HF_HUB_OFFLINE",
             "TRANSFORMERS_OFFLINE", "COVERAGE_", DISABLE_ENV)


@dataclass(frozen=True)
class Capability:
    """Whether this machine can confine a child, with the Landlock ABI and, when it cannot, why."""

    available: bool
    abi: int = 0
    reason: str = ""

    def describe(self) -> str:
        if not self.available:
            return f"no confinement here: {self.reason}"
        scoped = ", signals and abstract sockets scoped" if self.abi >= 6 else ""
        return f"Landlock ABI {self.abi} (files, TCP{scoped}) + seccomp (sockets)"


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
        return Capability(False, 0, f"{platform.system() or sys.platform} has no Landlock (it is a Linux feature)")
    machine = platform.machine()
    if machine not in _ARCH:
        return Capability(False, 0, f"the socket filter knows no {machine} system calls (x86_64 and aarch64 only)")
    try:
        libc = _libc()
    except OSError as error:
        return Capability(False, 0, f"cannot load the C library: {error}")
    abi, code = _landlock_abi(libc)
    if abi == 0:
        why = {errno.ENOSYS: "this kernel was built without Landlock (Linux 5.13+ with CONFIG_SECURITY_LANDLOCK)",
               errno.EOPNOTSUPP: "Landlock is disabled at boot (add landlock to the kernel's lsm= list)"}
        return Capability(False, 0, why.get(code, f"Landlock is unavailable ({os.strerror(code)})"))
    if abi < MIN_ABI:
        return Capability(False, abi, f"this kernel's Landlock is ABI {abi}, which cannot deny network access (ABI "
                          f"{MIN_ABI}, Linux 6.7, is the first that can)")
    if libc.prctl(_PR_GET_SECCOMP, 0, 0, 0, 0) < 0:
        return Capability(False, abi, "this kernel has no seccomp filters (CONFIG_SECCOMP_FILTER)")
    return Capability(True, abi)


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


def confine(writable: Iterable[Path], readable: Iterable[Path]) -> Capability:
    """Confine this process (and every process it starts) for good: writes only under ``writable``, reads and
    executes only under ``readable`` and the system's folders, no network. OSError when the kernel refuses."""
    global _CONFINED
    capability = probe()
    if not capability.available:
        raise OSError(errno.EPERM, capability.reason)
    tasks = os.listdir("/proc/self/task")
    if len(tasks) != 1:  # Landlock and seccomp bind the calling thread only: confine before any thread starts
        raise OSError(errno.EBUSY, f"the process already runs {len(tasks)} threads")
    libc = _libc()
    abi = capability.abi
    handled = _FS_BY_ABI[min(abi, 5)]
    attr = _RulesetAttr(handled, _NET_TCP, _SCOPES if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16
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
        _install_socket_filter(libc)
        if libc.syscall(ctypes.c_long(_SYS_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise _fail("landlock_restrict_self")
    finally:
        os.close(ruleset)
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
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


def _socket_filter(machine: str) -> bytes:
    """A classic BPF program for seccomp: socket() and io_uring_setup() fail, other calls of this ABI pass."""
    arch, nr_socket, nr_io_uring, x32 = _ARCH[machine]
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, eacces, enosys = 0x7FFF0000, 0x00050000 | errno.EACCES, 0x00050000 | errno.ENOSYS
    program: list[tuple[int, int, int, int]] = [(ld_abs, 0, 0, 4)]  # seccomp_data.arch
    body: list[tuple[int, int, int, int]] = [(ld_abs, 0, 0, 0)]  # seccomp_data.nr
    if x32:  # x32 system calls (bit 30) reach the same kernel code under other numbers
        body.append((jge, 3, 0, 0x40000000))
    body += [(jeq, 2, 0, nr_socket), (jeq, 2, 0, nr_io_uring), (ret, 0, 0, allow)]
    tail = [(ret, 0, 0, eacces), (ret, 0, 0, enosys)]
    # another architecture's calls (a 32-bit int 0x80) all fail: jump over the body to the last return
    program.append((jeq, 0, len(body) + 1, arch))
    program += body + tail
    return b"".join(struct.pack("HBBI", *op) for op in program)


def _install_socket_filter(libc: Any) -> None:
    code = _socket_filter(platform.machine())
    count = len(code) // 8
    buffer = ctypes.create_string_buffer(code, len(code))

    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = _Prog(count, ctypes.cast(buffer, ctypes.c_void_p))
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise _fail("prctl(PR_SET_SECCOMP)")


# ---------------------------------------------------------------------------------------------------------
# The parent side


def child_environment(box: Path) -> dict[str, str]:
    """The child's environment: no credentials, HOME and temporary files inside its box, no GPU."""
    env = {k: v for k, v in os.environ.items()
           if any(k == keep or (keep.endswith("_") and k.startswith(keep)) for keep in _KEEP_ENV)}
    env.update(HOME=str(box / "home"), TMPDIR=str(box / "tmp"), XDG_CACHE_HOME=str(box / "cache"),
               CUDA_VISIBLE_DEVICES="", PYTHONDONTWRITEBYTECODE="1", TF_CPP_MIN_LOG_LEVEL="2", HF_HUB_OFFLINE="1")
    return env


def run(function: str, request: Mapping[str, Any], box: Path, readable: Sequence[Path], log: Any = None,
        timeout: float = _TIMEOUT_S, what: str = "the conversion", confine_child: bool = True) -> dict[str, Any]:
    """Call ``function`` (``trtflow_stages.<module>:<name>``, taking and returning JSON) in a child confined to
    ``box`` (created empty; reads: ``readable`` and the system's folders); its answer, or StageFailed.

    ``confine_child=False`` runs the same child unconfined (a model the recipe trusts with ``trust_code``).
    """
    import shutil

    if not function.startswith("trtflow_stages.") or ":" not in function:
        raise ValueError(f"not a trtflow_stages function: {function!r}")
    box = box.absolute()
    if box.is_dir() and not box.is_symlink():
        shutil.rmtree(box)
    elif box.is_symlink() or box.exists():
        box.unlink()
    for sub in ("", "home", "tmp", "cache"):
        (box / sub).mkdir(parents=True, exist_ok=sub != "")
    spec = {"function": function, "request": dict(request), "box": str(box), "confine": confine_child,
            "parent": os.getpid(),
            "readable": [str(Path(p).absolute()) for p in readable]}
    spec_file = box.parent / f"{box.name}.request.json"
    spec_file.write_text(json.dumps(spec), encoding="utf-8")
    log_file = box.parent / f"{box.name}.log"
    command = [sys.executable, "-c", "import sys; from trtflow_stages.formats.confinement import child_main; "
               "sys.exit(child_main(sys.argv[1:]))", str(spec_file)]
    with open(log_file, "wb") as out:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=child_environment(box), cwd=box, start_new_session=True, close_fds=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:  # whatever happened (a timeout, Ctrl-C): nothing the child started outlives it
            _kill_group(proc)
    tail = _tail(log_file, 6000)
    if log is not None and tail:
        log.info("%s (child process): %s", what, tail)
    if code is None:
        raise StageFailed(f"{what} took more than {timeout:.0f} s and was stopped", hint=f"its log: {log_file}")
    answer = read_result(box)
    if code < 0 and not answer:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        raise StageFailed(f"{what} died of {name}", hint=f"its log: {log_file}")
    if "error" in answer or code != 0 or not answer:
        message = _printable(str(answer.get("error") or _last_lines(tail) or f"exit code {code}"))
        hint = str(answer.get("hint") or "")
        denied = _denied(message) or _denied(_printable(_tail(log_file, 1 << 18))) if confine_child else None
        if denied is not None:
            hint = (f"the model's code tried something the confinement forbids ({denied}): writing outside its "
                    "scratch folder, reading private files or using the network; if you trust this file as a "
                    "program, set trust_code: true on the node to run it unconfined" + (f"; {hint}" if hint else ""))
        # a mistake in what the recipe declares keeps its kind (exit 2), as in the node's own process; a forged
        # flag from the model's code can change no more than that code
        kind = RecipeMismatch if answer.get("mismatch") is True and denied is None else StageFailed
        raise kind(f"{what} failed: {message}", hint=hint or f"its log: {log_file}")
    return answer


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


def _tail(path: Path, limit: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _last_lines(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return " ".join(" ".join(lines[-3:]).split())[-500:]


_DENIED = re.compile(r"[^\n]{0,160}(?:Permission denied|Operation not permitted|PermissionError)[^\n]{0,160}")


def _denied(text: str) -> str | None:
    """The first line of ``text`` that says the kernel denied something (shortened), or None."""
    found = _DENIED.search(text)
    if found is None:
        return None
    line = found.group(0)
    errors = list(re.finditer(r"\w+(?:Error|Exception): ", line))  # from the error's name, if the line has one
    return " ".join(line[errors[-1].start() if errors else 0:].split())[:300]


def read_result(box: Path) -> dict[str, Any]:
    """The child's answer in ``box``: a regular file (not a link), at most a few MiB of JSON; {} when absent."""
    try:
        data = read_regular(box / RESULT_FILE, _RESULT_LIMIT)
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


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``limit`` bytes, opened without following a link."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        import stat

        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"{path.name} is not a regular file")
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"{path.name} is larger than {limit} bytes")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit + 1)[:limit]
    finally:
        os.close(fd)


def take_file(source: Path, target: Path) -> None:
    """Copy a file the child made to ``target`` (outside its box): a regular file with one link, never a symlink
    (the child could point one at a file it may not read; the copy must not follow it)."""
    import shutil
    import stat

    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise StageFailed(f"the confined conversion left no readable {source.name}: {error.strerror}") from error
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise StageFailed(f"the confined conversion left {source.name} as something other than a plain file")
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as out:
            shutil.copyfileobj(f, out, 1 << 20)


# ---------------------------------------------------------------------------------------------------------
# The child side


def _die_with_parent(parent: int) -> None:
    """Be killed if the node's process dies (kill -9 of trtflow), so no confined child keeps working unwatched."""
    try:
        _libc().prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if parent and os.getppid() != parent:
        os._exit(1)


def child_main(argv: Sequence[str]) -> int:
    """Entry point of the child: confine, call the function, write its answer (or the error) to result.json."""
    import importlib
    import traceback

    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    box = Path(spec["box"])
    _die_with_parent(int(spec.get("parent") or 0))
    answer: dict[str, Any]
    try:
        if spec["confine"]:
            capability = confine([box], [Path(p) for p in spec["readable"]])
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
