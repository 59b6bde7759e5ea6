"""What a confined child may see and call (`confinement` applies it; nothing else launches a model's code).

Deny by default, allow by name, in three layers the child cannot lift:

- **A file system of its own** (new mount, user, pid, network, IPC, UTS and cgroup namespaces; made by bubblewrap,
  or by `sandbox_unshare` where it is not installed): only the
  system's programs and libraries (``/usr``), the interpreter's and the packages' folders, the model's files
  (all read-only), a few files loaders read (``/etc/ld.so.cache``, the time zone, a passwd naming only the child),
  a ``/proc`` of its own processes, a minimal ``/dev``, and its box (read-write, at ``/box``). ``/etc/shadow``,
  ``~/.ssh``, other projects and the store are not there to be read, chmod-ed or linked. No network at all: the
  network namespace has only a loopback device that is down. No capabilities, a new session, and it dies with
  its parent.
- **An environment cleared** but for the variables `KEEP_ENV` names exactly (no prefixes), plus HOME and
  TMPDIR inside the box.
- **A system-call allow-list** (`allowed_syscalls`, compiled by libseccomp through ``pyseccomp``, loaded by
  bubblewrap before the interpreter starts): file I/O, memory, threads, time, signals; every other call fails
  with EPERM, among them every change of metadata (chmod, chown, utime, xattr), device nodes, mounts,
  namespaces, ptrace and reading other processes' memory, sockets of every family, keyrings, BPF, io_uring,
  perf, fanotify, handles, module loading, clocks, reboot and the like. ``clone`` is allowed only without
  namespace flags; a call of another architecture's ABI
  kills the child.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

#: Where the child's box (its only writable folder, its working folder) is, inside its file system.
BOX = "/box"
#: The child's user and group inside its namespace (an unprivileged name; it maps to the caller outside).
CHILD_ID = 65534
#: Environment variables the child keeps, by exact name: where libraries are, locale, threads, log levels.
KEEP_ENV = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "TZ", "LD_LIBRARY_PATH", "PYTHONPATH",
            "PYTHONHASHSEED", "VIRTUAL_ENV", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
            "KMP_AFFINITY", "TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS", "TF_NUM_INTEROP_THREADS",
            "TF_NUM_INTRAOP_THREADS", "TF_USE_LEGACY_KERAS", "KERAS_BACKEND", "TORCH_NUM_THREADS",
            "COVERAGE_PROCESS_START", "TRTFLOW_NO_CONFINEMENT")
#: Files of /etc that loaders read (the dynamic linker's cache, locale and time zone settings).
_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/timezone",
        "/etc/nsswitch.conf", "/etc/mime.types")
#: Machine-wide facts some runtimes read (how many CPUs).
_SYS = ("/sys/devices/system/cpu", "/sys/fs/cgroup/cpu.max")

#: The allow-list, by family (names the running architecture lacks are skipped).
_ALLOWED = {
    "files": "read write readv writev pread64 pwrite64 preadv pwritev preadv2 pwritev2 lseek _llseek open openat "
             "openat2 creat close close_range dup dup2 dup3 fcntl fcntl64 flock fsync fdatasync syncfs "
             "sync_file_range ftruncate ftruncate64 truncate truncate64 fallocate fadvise64 fadvise64_64 readahead "
             "sendfile sendfile64 copy_file_range splice tee stat stat64 fstat fstat64 lstat lstat64 newfstatat "
             "fstatat64 statx statfs statfs64 fstatfs fstatfs64 access faccessat faccessat2 getdents getdents64 "
             "getcwd chdir fchdir readlink readlinkat mkdir mkdirat rmdir unlink unlinkat rename renameat "
             "renameat2 link linkat symlink symlinkat umask getxattr lgetxattr fgetxattr listxattr llistxattr "
             "flistxattr memfd_create ioctl",
    "waiting": "pipe pipe2 select _newselect pselect6 poll ppoll epoll_create epoll_create1 epoll_ctl epoll_wait "
               "epoll_pwait epoll_pwait2 eventfd eventfd2 signalfd signalfd4 timerfd_create timerfd_settime "
               "timerfd_gettime inotify_init inotify_init1 inotify_add_watch inotify_rm_watch",
    "memory": "brk mmap mmap2 munmap mremap mprotect madvise mlock mlock2 munlock mlockall munlockall mincore msync "
              "membarrier mbind get_mempolicy set_mempolicy set_mempolicy_home_node pkey_alloc pkey_free "
              "pkey_mprotect",
    "processes": "fork vfork execve execveat exit exit_group wait4 waitid getpid getppid gettid getuid geteuid "
                 "getgid getegid getgroups getresuid getresgid getpgrp getpgid getsid setsid setpgid "
                 "set_tid_address set_robust_list get_robust_list rseq futex futex_waitv futex_time64 sched_yield "
                 "sched_getaffinity sched_setaffinity sched_getparam sched_getscheduler sched_setscheduler "
                 "sched_setparam sched_getattr sched_setattr sched_get_priority_max sched_get_priority_min "
                 "sched_rr_get_interval getpriority setpriority getrlimit setrlimit ugetrlimit prlimit64 getrusage "
                 "times uname sysinfo prctl arch_prctl capget getcpu ioprio_get ioprio_set personality "
                 "landlock_create_ruleset landlock_add_rule landlock_restrict_self",
    "signals": "rt_sigaction rt_sigprocmask rt_sigreturn rt_sigsuspend rt_sigpending rt_sigtimedwait "
               "rt_sigtimedwait_time64 sigaltstack sigreturn kill tgkill tkill pause restart_syscall",
    "time": "nanosleep clock_nanosleep clock_nanosleep_time64 clock_gettime clock_gettime64 clock_getres "
            "clock_getres_time64 gettimeofday time alarm getitimer setitimer timer_create timer_settime "
            "timer_settime64 timer_gettime timer_gettime64 timer_getoverrun timer_delete getrandom",
    "ipc": "shmget shmat shmdt shmctl semget semop semtimedop semctl msgget msgsnd msgrcv msgctl",  # (own IPC ns)
}
_NEW_NAMESPACES = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_PERSONALITY_OK = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)  # linux, +UNAME26 / +ADDR_NO_RANDOMIZE, query


def allowed_syscalls() -> list[str]:
    """Every system call a confined child may make without a condition (besides clone and personality). ``ioctl``
    is among them: the child has no terminal (a new session, its output a file) to inject keystrokes into."""
    return sorted({name for names in _ALLOWED.values() for name in names.split()} - {"personality"})


def seccomp_program() -> bytes:
    """The allow-list as a classic BPF program for the running architecture (libseccomp through pyseccomp);
    ImportError or OSError when libseccomp is missing."""
    import pyseccomp as seccomp

    deny = seccomp.ERRNO(errno.EPERM)
    program = seccomp.SyscallFilter(defaction=deny)
    program.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.KILL_PROCESS)
    for name in allowed_syscalls():
        try:
            program.add_rule(seccomp.ALLOW, name)
        except (ValueError, OSError):  # not a call of this architecture
            continue
    program.add_rule(seccomp.ALLOW, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, _NEW_NAMESPACES, 0))
    program.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")  # (its flags are in memory: C libraries fall back)
    for persona in _PERSONALITY_OK:
        program.add_rule(seccomp.ALLOW, "personality", seccomp.Arg(0, seccomp.EQ, persona))
    read, write = os.pipe()
    try:
        with os.fdopen(write, "wb") as out:
            program.export_bpf(out)
        with os.fdopen(read, "rb") as source:
            read = -1
            return source.read()
    finally:
        if read >= 0:
            os.close(read)


def child_environment(home: str) -> dict[str, str]:
    """The child's environment: the variables named in KEEP_ENV, HOME and temporary files in its box, no GPU."""
    env = {name: os.environ[name] for name in KEEP_ENV if name in os.environ}
    env.update(HOME=f"{home}/home", TMPDIR=f"{home}/tmp", XDG_CACHE_HOME=f"{home}/cache", USER="trtflow",
               LOGNAME="trtflow", CUDA_VISIBLE_DEVICES="", PYTHONDONTWRITEBYTECODE="1", TF_CPP_MIN_LOG_LEVEL="2",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def library_folders() -> list[str]:
    """The interpreter's and the packages' folders (read-only in the child)."""
    import trtflow
    import trtflow_stages

    prefixes = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    paths = [*prefixes, os.path.dirname(sys.executable)]
    # sys.path's package folders, not a working folder on it (``python -m`` puts the project there)
    paths += [p for p in sys.path if p and os.path.isabs(p) and os.path.isdir(p)
              and (p.endswith(("site-packages", "dist-packages")) or any(_under(p, x) for x in prefixes))]
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(p)]
    paths += [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if os.path.isabs(p)]
    paths += [os.path.dirname(trtflow.__file__), os.path.dirname(trtflow_stages.__file__)]
    return paths


def bwrap_arguments(box_fd: int, sources: Sequence[tuple[int, str]], data: Iterable[tuple[int, str]],
                    seccomp_fd: int, env: dict[str, str]) -> list[str]:
    """bubblewrap's arguments (without the program and the command): ``box_fd`` at BOX read-write, each of
    ``sources`` (fd, path as the request spells it) read-only at its path, ``data`` (fd, path) as read-only files,
    the allow-list from ``seccomp_fd``, ``env`` only."""
    args = ["--unshare-all", "--unshare-user", "--uid", str(CHILD_ID), "--gid", str(CHILD_ID), "--hostname",
            "trtflow", "--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL"]
    args += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--proc", "/proc", "--dev", "/dev"]
    for path in _ETC + _SYS:
        args += ["--ro-bind-try", path, path]
    for path in _outermost(library_folders()):
        args += ["--ro-bind", path, path]
    for fd, path in data:
        args += ["--ro-bind-data", str(fd), path]
    for fd, path in sources:
        args += ["--ro-bind-fd", str(fd), path]
    args += ["--bind-fd", str(box_fd), BOX, "--chdir", BOX, "--seccomp", str(seccomp_fd)]
    for name, value in env.items():
        args += ["--setenv", name, value]
    return args


def _under(path: str, folder: str) -> bool:
    return Path(path).is_relative_to(folder)


def unshare_plan(box_fd: int, sources: Sequence[tuple[int, str]], data: Iterable[tuple[int, str]],
                 seccomp_fd: int, env: dict[str, str], command: list[str]) -> tuple[dict, list[int]]:
    """The same sandbox for `sandbox_unshare` (no bubblewrap): its plan and the descriptors it opened for it (the
    caller passes them to the child and closes them after)."""
    import pyseccomp

    opened: list[int] = []
    binds: list[tuple[int, str, str, bool]] = []  # (descriptor, path in the parent's view, target, writable)

    def bind(path: str, target: str, writable: bool = False) -> None:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return
        opened.append(fd)
        binds.append((fd, os.path.realpath(path), target, writable))

    links = []
    bind("/usr", "/usr")
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            links.append((top, os.readlink(top)))
        elif os.path.isdir(top):
            bind(top, top)
    for path in _ETC + _SYS:
        if os.path.exists(path):
            bind(path, path)
    for path in _outermost(library_folders()):
        bind(path, path)
    binds += [(fd, os.readlink(f"/proc/self/fd/{fd}"), path, False) for fd, path in sources]
    binds.append((box_fd, os.readlink(f"/proc/self/fd/{box_fd}"), BOX, True))
    plan = {"id": CHILD_ID, "binds": binds, "links": links, "files": list(data), "seccomp": seccomp_fd,
            "env": env, "command": command, "chdir": BOX,
            "pivot_root": pyseccomp.resolve_syscall(pyseccomp.system_arch(), "pivot_root")}
    return plan, opened


def identity_files() -> dict[str, bytes]:
    """/etc/passwd and /etc/group naming only the child (some libraries ask who they run as)."""
    return {"/etc/passwd": f"trtflow:x:{CHILD_ID}:{CHILD_ID}:trtflow:{BOX}/home:/usr/sbin/nologin\n".encode(),
            "/etc/group": f"trtflow:x:{CHILD_ID}:\n".encode()}


def _outermost(paths: Iterable[str]) -> list[str]:
    """The folders among ``paths`` (as spelled and resolved) that no other one, nor /usr, contains."""
    found: set[str] = set()
    for path in paths:
        for form in (os.path.abspath(path), os.path.realpath(path)):
            if os.path.isdir(form):
                found.add(form.rstrip("/") or "/")
    chosen: list[str] = []
    for path in sorted(found, key=len):
        if path == "/" or any(Path(path).is_relative_to(c) for c in [*chosen, "/usr"]):
            continue
        chosen.append(path)
    return chosen
