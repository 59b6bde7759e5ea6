"""What a node's ``python:`` code reads, observed at the level of system calls (seccomp user notification).

The stage of a node with ``python:`` references runs in a child process of its worker (`observed`). Before it runs
anything, the child installs a seccomp filter (``SECCOMP_RET_USER_NOTIF``, Linux 5.5+) on the system calls that
name a file to read: ``open``, ``openat``, ``openat2``, ``execve``, ``execveat``, ``readlink``, ``readlinkat``
(and ``chdir``: the links on the way to a working folder); and
hands the filter's listener to its parent, the supervisor. From then on each such call, by any thread of the child
and by any process it starts (a filter is inherited across ``fork``, ``clone`` and ``execve``), waits until the
supervisor has read the path from the caller's memory (``/proc/<pid>/mem``; the caller is blocked, so the path
cannot change meanwhile), resolved it against the caller's working folder or the folder descriptor it names, and
walked it component by component, noting every symbolic link on the way (as spelled, with its target) and the file
it resolves to with its signature at that moment; then the call proceeds unchanged
(``SECCOMP_USER_NOTIF_FLAG_CONTINUE``). Native code (a library opening weights), threads, subprocesses and
memory-mapped files are all seen, since all of them open the file first.

Calls that would read files out of sight of this list (``open_by_handle_at``, ``io_uring_setup``, ``uselib``)
or change what a path means (``chroot``, ``pivot_root``, ``mount``, ``move_mount``, ``open_tree``, ``fsmount``,
``setns``), and any system call of another ABI (32-bit calls, x32), make the run *unobserved*: it proceeds, and
its result is never reused (`depfile.CHANGED`). So does a path that cannot be read (a process not ours to read).
Where the kernel has no seccomp user notification (not Linux, before 5.5, or a filter already forbids it), every
run is unobserved and nodes with ``python:`` code are rebuilt on every run, saying why.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import select
import signal
import socket
import stat
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# (syscall -> (number on x86_64, number on aarch64)); None: the call does not exist there
_READS = {"open": (2, None), "openat": (257, 56), "openat2": (437, 437), "execve": (59, 221),
          "execveat": (322, 281), "readlink": (89, None), "readlinkat": (267, 78), "chdir": (80, 49)}
_BLIND = {"open_by_handle_at": (304, 265), "io_uring_setup": (425, 425), "uselib": (134, None),
          "chroot": (161, 51), "pivot_root": (155, 41), "mount": (165, 40), "move_mount": (429, 429),
          "open_tree": (428, 428), "fsmount": (432, 432), "setns": (308, 268)}
_ARCH = {"x86_64": (0, 0xC000003E, 317), "aarch64": (1, 0xC00000B7, 277)}  # column, AUDIT_ARCH, seccomp()
_RET_ALLOW, _RET_NOTIFY = 0x7FFF0000, 0x7FC00000
_NEW_LISTENER, _CONTINUE = 8, 1
_RECV, _SEND, _ID_VALID = 0xC0502100, 0xC0182101, 0x40082102
_AT_FDCWD = -100
_WRITE_ONLY = os.O_WRONLY
_PATH_MAX = 4096


@dataclass
class Reads:
    """What the observed process tree read: files (resolved, real paths) with their signature when first read
    (None: not there), symbolic links met on the way (link path -> target), and why the run is unobserved."""

    files: dict[str, tuple[int, int, int, int] | None] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    blind: list[str] = field(default_factory=list)


def _numbers() -> tuple[int, int, dict[int, str], dict[int, str]] | None:
    arch = _ARCH.get(platform.machine())
    if arch is None or not sys.platform.startswith("linux"):
        return None
    column, audit, nr = arch
    reads = {numbers[column]: name for name, numbers in _READS.items() if numbers[column] is not None}
    blind = {numbers[column]: name for name, numbers in _BLIND.items() if numbers[column] is not None}
    return audit, nr, reads, blind  # type: ignore[return-value]


def _program(audit: int, watched: list[int]) -> bytes:
    """The filter: another ABI or an x32 call -> notify; a watched call -> notify; anything else -> allow."""
    ld_w_abs, jeq_k, jge_k, ret_k = 0x20, 0x15, 0x35, 0x06
    n = len(watched)
    notify_at = 6 + n  # index of the final "return notify"
    code = [(ld_w_abs, 0, 0, 4), (jeq_k, 1, 0, audit), (ret_k, 0, 0, _RET_NOTIFY), (ld_w_abs, 0, 0, 0),
            (jge_k, notify_at - 5, 0, 0x40000000)]
    for i, number in enumerate(watched):
        code.append((jeq_k, notify_at - (6 + i), 0, number))
    code += [(ret_k, 0, 0, _RET_ALLOW), (ret_k, 0, 0, _RET_NOTIFY)]
    return b"".join(struct.pack("HBBI", *ins) for ins in code)


def install() -> int:
    """Install the filter on this process (one thread: call it right after ``fork``); the listener's descriptor.
    OSError when the kernel cannot."""
    numbers = _numbers()
    if numbers is None:
        raise OSError(errno.ENOSYS, f"no seccomp user notification on {sys.platform} {platform.machine()}")
    audit, nr, reads, blind = numbers
    libc = ctypes.CDLL(None, use_errno=True)
    program = _program(audit, sorted({*reads, *blind}))
    buffer = ctypes.create_string_buffer(program)
    fprog = struct.pack("HxxxxxxQ", len(program) // 8, ctypes.addressof(buffer))
    fprog_buffer = ctypes.create_string_buffer(fprog)
    libc.syscall.restype = ctypes.c_long

    def load() -> int:
        return int(libc.syscall(ctypes.c_long(nr), ctypes.c_long(1), ctypes.c_long(_NEW_LISTENER), fprog_buffer))

    fd = load()  # with CAP_SYS_ADMIN (root): set-user-ID programs the code runs keep working
    if fd < 0 and ctypes.get_errno() == errno.EACCES:
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS: what an unprivileged filter requires
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        fd = load()
    if fd < 0:
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER, NEW_LISTENER)")
    return fd


class _Gone(Exception):
    """The task that made a call is gone (its memory may now be another's)."""


class _Supervisor:
    """Answers the notifications of one observed process tree, noting what each call read."""

    def __init__(self, listener: int, keep: Callable[[str], bool]) -> None:
        numbers = _numbers()
        assert numbers is not None
        self.reads_nr, self.blind_nr = numbers[2], numbers[3]
        self.audit = numbers[0]
        self.listener = listener
        self.keep = keep
        self.reads = Reads()

    def close(self) -> None:
        os.close(self.listener)

    def serve_one(self) -> None:
        notif = bytearray(80)
        try:
            import fcntl

            fcntl.ioctl(self.listener, _RECV, notif)
        except OSError as exc:  # ENOENT: the caller died (or was interrupted) before we read it
            if exc.errno in (errno.ENOENT, errno.EINTR):
                return
            raise
        ident, pid, _, nr, arch = struct.unpack_from("QIIiI", notif)
        args = struct.unpack_from("6Q", notif, 32)
        try:
            self._note(ident, pid, nr, arch, args)
        finally:
            self._respond(ident)

    def _respond(self, ident: int) -> None:
        import fcntl

        try:
            fcntl.ioctl(self.listener, _SEND, bytearray(struct.pack("QqiI", ident, 0, 0, _CONTINUE)))
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise

    def _note(self, ident: int, pid: int, nr: int, arch: int, args: tuple[int, ...]) -> None:
        name = self.reads_nr.get(nr) if arch == self.audit else None
        if name is None:
            what = self.blind_nr.get(nr) if arch == self.audit else None
            self.reads.blind.append(f"the code called {what}" if what else
                                    f"the code made system call {nr} of another ABI ({arch:#x})")
            return
        try:
            spelled = self._path(ident, pid, name, args)
            if spelled is not None:
                self._walk(spelled, pid)
        except _Gone:
            return  # the caller died before its call went on: it read nothing
        except (OSError, ValueError, struct.error) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            self.reads.blind.append(f"the path of a {name} call could not be followed ({why})")

    def _path(self, ident: int, pid: int, name: str, args: tuple[int, ...]) -> str | None:
        """The absolute path a call names as spelled (None: a write-only open)."""
        at = name.endswith("at") or name.endswith("at2")
        dirfd = ctypes.c_int32(args[0] & 0xFFFFFFFF).value if at else _AT_FDCWD
        address = args[1] if at else args[0]
        if name in ("open", "openat", "openat2"):
            flags = (struct.unpack("Q", self._read(pid, args[2], 8))[0] if name == "openat2"
                     else args[2] if name == "openat" else args[1])
            if flags & 3 == _WRITE_ONLY or flags & os.O_TRUNC:  # written, or emptied first: nothing read from it
                return None
        raw = self._read(pid, address, _PATH_MAX)
        path = os.fsdecode(raw.split(b"\0", 1)[0])
        self._still_valid(ident)
        if name == "execveat" and not path:  # AT_EMPTY_PATH: the descriptor itself
            return os.readlink(f"/proc/{pid}/fd/{dirfd}")
        if not os.path.isabs(path):
            base = os.readlink(f"/proc/{pid}/cwd" if dirfd == _AT_FDCWD else f"/proc/{pid}/fd/{dirfd}")
            path = os.path.join(base, path)
        return _own_proc(path, pid)

    def _read(self, pid: int, address: int, size: int) -> bytes:
        """``size`` bytes (up to the first NUL) at ``address`` in the caller's memory, through a descriptor opened
        for this read: one kept from an earlier call could name other memory. A process started by ``vfork``
        (`subprocess` does) shares its parent's memory until its ``execve``; a descriptor opened then still reads the
        parent's memory after it (the parent keeps it alive): the paths of the child's later calls came out as the
        parent's code (seen in CI: a node's reason with machine code for a file name)."""
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = b""
            while len(data) < size:
                page_left = 4096 - (address + len(data)) % 4096
                chunk = os.pread(fd, min(page_left, size - len(data)), address + len(data))
                if not chunk:
                    break
                data += chunk
                if b"\0" in chunk:
                    break
            return data
        finally:
            os.close(fd)

    def _still_valid(self, ident: int) -> None:
        import fcntl

        try:
            fcntl.ioctl(self.listener, _ID_VALID, bytearray(struct.pack("Q", ident)))
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise _Gone from None
            raise

    def _walk(self, path: str, pid: int) -> None:
        """Resolve ``path`` component by component, noting each link (as spelled and its target) and the file."""
        parts = [p for p in path.split("/") if p]
        done = "/"
        hops = 0
        while parts:
            part = parts.pop(0)
            if part == ".":
                continue
            if part == "..":
                done = os.path.dirname(done)
                continue
            here = os.path.join(done, part)
            try:
                st = os.lstat(here)
            except OSError:
                done = os.path.join(here, *parts)
                parts = []
                break
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(here)
                if self.keep(here):
                    self.reads.links.setdefault(here, target)
                hops += 1
                if hops > 40:
                    return
                target = _own_proc(target, pid) if target.startswith("/") else target
                parts = [p for p in target.split("/") if p] + parts
                if target.startswith("/"):
                    done = "/"
                continue
            done = here
        if done in self.reads.files or not self.keep(done):
            return
        try:
            st = os.stat(done)
            if stat.S_ISDIR(st.st_mode):  # a folder opened to be listed: its listing is not keyed
                return
            self.reads.files[done] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino) \
                if stat.S_ISREG(st.st_mode) else None
        except OSError:
            self.reads.files[done] = None


def _own_proc(path: str, pid: int) -> str:
    """``/proc/self`` and ``/dev/fd`` as the caller means them (not the supervisor's)."""
    for alias, real in (("/proc/self", f"/proc/{pid}"), ("/proc/thread-self", f"/proc/{pid}/task/{pid}"),
                        ("/dev/fd", f"/proc/{pid}/fd")):
        if path == alias or path.startswith(alias + "/"):
            return real + path[len(alias):]
    return path


def observed(run: Callable[[], dict[str, Any]], keep: Callable[[str], bool], env: dict[str, str]
             ) -> tuple[dict[str, Any], Reads]:
    """Run ``run`` in a child process whose reads are observed (its environment replaced by ``env``); its result
    (JSON: what ``run`` returned) and what the child and every process it started read."""
    control, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    result_r, result_w = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        _child(run, env, parent, control, child_end, result_r, result_w)
    child_end.close()
    os.close(result_w)
    reads = Reads()
    try:
        listener = _receive_listener(control, reads)
        payload = _supervise(listener, result_r, keep, reads, pid)
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        control.close()
        os.close(result_r)
        status = _reap(pid)
    try:
        result = json.loads(payload)
    except ValueError:
        ended = (f"was killed by {signal.Signals(os.WTERMSIG(status)).name}" if os.WIFSIGNALED(status)
                 else f"exited with {os.waitstatus_to_exitcode(status)}")
        result = {"status": "failed", "error": f"the node's observed process {ended} before giving its result",
                  "hint": "see the node's log; SIGKILL is often the kernel ending a process out of memory"}
    return result, reads


def _child(run: Callable[[], dict[str, Any]], env: dict[str, str], parent: int, control: socket.socket,
           child_end: socket.socket, result_r: int, result_w: int) -> None:  # pragma: no cover - child
    code = 0
    try:
        control.close()
        os.close(result_r)
        if sys.platform.startswith("linux"):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)
        try:
            listener = install()
        except OSError as exc:
            child_end.sendall(json.dumps({"unobserved": str(exc)}).encode())
        else:
            socket.send_fds(child_end, [b"{}"], [listener])
            os.close(listener)
        child_end.close()
        os.environ.clear()
        os.environ.update(env)
        payload = json.dumps(run(), default=str).encode()
        view = memoryview(payload)
        while view:
            view = view[os.write(result_w, view):]
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 70
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _receive_listener(control: socket.socket, reads: Reads) -> int | None:
    message, fds, _, _ = socket.recv_fds(control, 4096, 1)
    if fds:
        return fds[0]
    try:
        why = json.loads(message or b"{}").get("unobserved") or "the child ended before installing its filter"
    except ValueError:
        why = "the child's report could not be read"
    reads.blind.append(f"reads not observed: {why}")
    return None


def _supervise(listener: int | None, result_r: int, keep: Callable[[str], bool], reads: Reads, pid: int
               ) -> bytes:
    """Answer notifications until the observed tree is gone (the child ended and no process it started is left:
    one that outlives it makes the run unobserved); the child's result."""
    supervisor = _Supervisor(listener, keep) if listener is not None else None
    poller = select.poll()
    poller.register(result_r, select.POLLIN)
    if supervisor is not None:
        poller.register(supervisor.listener, select.POLLIN)
    chunks: list[bytes] = []
    result_open = True
    try:
        while result_open or supervisor is not None:
            ready = poller.poll(None if result_open else 200)
            if not ready and supervisor is not None and _ended(pid):
                reads.blind.append("a process the code started outlived it")
                break
            for fd, event in ready:
                if fd == result_r:
                    chunk = os.read(result_r, 1 << 16)
                    if chunk:
                        chunks.append(chunk)
                        continue
                    result_open = False
                    poller.unregister(result_r)
                elif supervisor is not None and event & select.POLLIN:
                    supervisor.serve_one()
                elif supervisor is not None:  # POLLHUP: no process of the tree is left
                    poller.unregister(supervisor.listener)
                    reads.files.update(supervisor.reads.files)
                    reads.links.update(supervisor.reads.links)
                    reads.blind += supervisor.reads.blind
                    supervisor.close()
                    supervisor = None
    finally:
        if supervisor is not None:
            reads.files.update(supervisor.reads.files)
            reads.links.update(supervisor.reads.links)
            reads.blind += supervisor.reads.blind
            supervisor.close()
    return b"".join(chunks)


def _ended(pid: int) -> bool:
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    if done == pid:
        _REAPED[pid] = status
    return done == pid


_REAPED: dict[int, int] = {}


def _reap(pid: int) -> int:
    """The child's wait status (0 if it was already reaped without one)."""
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return _REAPED.pop(pid, 0)
        except InterruptedError:
            continue
