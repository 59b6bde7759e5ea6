"""The sandbox without bubblewrap: the kernel's own namespaces, set up by this small program (standard library only,
run as ``python -I -S sandbox_unshare.py PLAN_FD``), then the child's command in their place.

`confinement` uses it where no ``bwrap`` is installed, with the same policy (`sandbox_policy`): new user, mount,
PID, network, IPC, UTS and cgroup namespaces; a root file system on a fresh tmpfs holding only the folders and
files of the plan, bound from descriptors the parent opened (read-only but the box), its own ``/proc``, a few
devices; the root then made read-only; no new privileges; the seccomp program of the plan; the environment of the
plan only; every other descriptor closed. A failure at any step ends it with exit code 125 and the step named on
standard error, before the child's command runs.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

_CLONE = {"ns": 0x00020000, "cgroup": 0x02000000, "uts": 0x04000000, "ipc": 0x08000000, "user": 0x10000000,
          "pid": 0x20000000, "net": 0x40000000}
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18)
_ST_FLAGS = {os.ST_NOSUID: _MS_NOSUID, os.ST_NODEV: _MS_NODEV, os.ST_NOEXEC: _MS_NOEXEC}
_DEVICES = ("null", "zero", "full", "random", "urandom")
_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _mount(source: str | None, target: str, kind: str | None, flags: int) -> None:
    _check(_libc.mount(source and source.encode(), target.encode(), kind and kind.encode(), ctypes.c_ulong(flags),
                       None), f"mount {source} on {target}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _bind(root: str, source: str, target: str, writable: bool, fd: int | None = None) -> None:
    """``source`` bound at ``target`` under ``root``; read-only unless ``writable`` (keeping the flags the kernel
    locks on the original mount); with ``fd``, the bound file must be the one the parent opened."""
    inside = root + target
    if os.path.isdir(source):
        os.makedirs(inside, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(inside), exist_ok=True)
        if not os.path.exists(inside):
            open(inside, "w").close()
    _mount(source, inside, None, _MS_BIND | _MS_REC)
    if fd is not None:
        held, bound = os.fstat(fd), os.stat(inside)
        if (held.st_dev, held.st_ino) != (bound.st_dev, bound.st_ino):
            raise OSError(16, f"{source} changed after trtflow opened it")
    locked = sum(flag for st, flag in _ST_FLAGS.items() if os.statvfs(inside).f_flag & st)
    devices = target.startswith("/dev/")
    _mount(None, inside, None, _MS_BIND | _MS_REMOUNT | _MS_NOSUID | (0 if devices else _MS_NODEV) | locked
           | (0 if writable else _MS_RDONLY))


def _setup(plan: dict) -> None:
    uid, gid = os.getuid(), os.getgid()
    flags = 0
    for name in ("user", "ns", "pid", "net", "ipc", "uts", "cgroup"):
        flags |= _CLONE[name]
    _check(_libc.unshare(flags), "unshare")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{plan['id']} {uid} 1\n")
    _write("/proc/self/gid_map", f"{plan['id']} {gid} 1\n")


def _pivot(plan: dict, new_root: str, put_old: str) -> None:
    _check(_libc.syscall(ctypes.c_long(plan["pivot_root"]), new_root.encode(), put_old.encode()), "pivot_root")


def _build_root(plan: dict) -> None:
    """As bubblewrap does: a tmpfs becomes the root with the old one under /oldroot; the child's root is built in
    /newroot from /oldroot (each bind checked against the parent's descriptor), then becomes the only root."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    _mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV)
    os.mkdir("/tmp/oldroot")
    _pivot(plan, "/tmp", "/tmp/oldroot")
    os.chdir("/")
    root = "/newroot"
    os.mkdir(root)
    _mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV)
    for fd, path, target, writable in plan["binds"]:
        _bind(root, "/oldroot" + path, target, writable, fd)
    for link, target in plan["links"]:
        os.symlink(target, root + link)
    for fd, target in plan["files"]:
        os.makedirs(os.path.dirname(root + target), exist_ok=True)
        with open(root + target, "wb") as out:
            out.write(os.pread(fd, 1 << 20, 0))
    os.makedirs(root + "/dev", exist_ok=True)
    for device in _DEVICES:
        _bind(root, f"/oldroot/dev/{device}", f"/dev/{device}", True)
    os.makedirs(root + "/proc", exist_ok=True)
    _mount("proc", root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    _check(_libc.umount2(b"/oldroot", 2), "umount /oldroot")  # MNT_DETACH
    os.chdir(root)
    _pivot(plan, ".", ".")
    _check(_libc.umount2(b".", 2), "umount the staging root")
    os.chdir("/")
    _mount(None, "/", None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    os.chdir(plan["chdir"])


def _seal(plan: dict) -> None:
    _check(_libc.sethostname(b"trtflow", 7), "sethostname")
    _check(_libc.prctl(38, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    _check(_libc.prctl(1, 9, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    program = os.pread(plan["seccomp"], 1 << 20, 0)

    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buffer = ctypes.create_string_buffer(program, len(program))
    prog = _Prog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    os.closerange(3, 1 << 16)  # (nothing of the parent's but standard input, output and error)
    _check(_libc.prctl(22, 2, ctypes.byref(prog), 0, 0), "prctl(PR_SET_SECCOMP)")  # last: it denies what set up


def main(argv: list[str]) -> int:
    step = "reading the plan"
    try:
        with os.fdopen(int(argv[0]), "rb") as source:
            plan = json.loads(source.read())
        step = "making the namespaces"
        _setup(plan)
        pid = os.fork()  # (the first process of the new PID namespace runs the command)
        if pid:
            _libc.prctl(1, 9, 0, 0, 0)
            while True:
                try:
                    _, status = os.waitpid(pid, 0)
                    break
                except ChildProcessError:
                    return 125
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
        step = "building its file system"
        _build_root(plan)
        step = "sealing it"
        _seal(plan)
        os.execve(plan["command"][0], plan["command"], plan["env"])
    except OSError as error:
        print(f"trtflow sandbox: {step}: {error}", file=sys.stderr, flush=True)
        os._exit(125)
    return 125


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
