"""A hostile payload for the sandbox's conformance test: Python source that a model file carries (a `.pt2` whose
symbolic shape runs it), which tries, from inside the confined child, every family of system call that could
change or reveal something outside, and writes what happened to ``battery.json`` in its working folder.

Families (from the system-call table): metadata changes (chmod, chown, utime, xattr), links and renames,
writes and truncation, device nodes and FIFOs, mounts and root changes, namespaces, ptrace and other processes'
memory, signals to other processes, sockets of every address family, keyrings, BPF, io_uring, perf, fanotify,
userfaultfd, file handles, kernel modules, kexec, reboot, swap, accounting, clocks, host names, I/O ports,
identity and capabilities; reads of other processes' /proc, of /sys and of secrets; inherited descriptors; the
environment. Each entry: ``{"family", "call", "ok": bool, "errno": name, "detail"}``; ``raw`` marks a call made
by number, whose denial by the allow-list shows as EPERM or ENOSYS (not as a later argument check).
"""

from __future__ import annotations

from pathlib import Path

REPORT = "battery.json"

_SOURCE = r'''
import ctypes, errno, json, os, socket, stat, sys
import pyseccomp
VICTIMS = __VICTIMS__
HOST_PIDS = __PIDS__
MODEL = __MODEL__
results = []
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
arch = pyseccomp.system_arch()
# the other processes of its PID namespace (bubblewrap's init is 1; made without bubblewrap, the child is 1)
OTHERS = [p for p in (1, os.getppid()) if p not in (0, os.getpid())]

def record(family, call, action, raw=False):
    entry = {"family": family, "call": call, "raw": raw}
    try:
        value = action()
        entry.update(ok=True, detail=repr(value)[:120])
    except OSError as error:
        entry.update(ok=False, errno=errno.errorcode.get(error.errno, str(error.errno)), detail=str(error)[:160])
    except Exception as error:
        entry.update(ok=False, errno="", detail=(type(error).__name__ + ": " + str(error))[:160])
    results.append(entry)

def raw(family, name, *args):
    def call():
        number = pyseccomp.resolve_syscall(arch, name)
        if number < 0:
            raise OSError(errno.ENOSYS, name + " is not a call of this architecture")
        result = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) for a in args])
        if result == 0 and name in ("clone", "fork"):
            os._exit(0)  # (a child it made)
        if result < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        return result
    record(family, name, call, raw=True)

targets = [*VICTIMS, MODEL, "/usr/bin/env", sys.executable, "/box"]
for path in targets:
    record("metadata", "chmod " + path, lambda p=path: os.chmod(p, 0o777))
    record("metadata", "chown " + path, lambda p=path: os.chown(p, 65534, 65534))
    record("metadata", "lchown " + path, lambda p=path: os.lchown(p, 65534, 65534))
    record("metadata", "utime " + path, lambda p=path: os.utime(p, (1e9, 1e9)))
    record("metadata", "setxattr " + path, lambda p=path: os.setxattr(p, "user.pwned", b"1"))
    record("metadata", "removexattr " + path, lambda p=path: os.removexattr(p, "user.trtflow"))
for path in [*VICTIMS, MODEL, "/usr/bin/env"]:
    record("metadata", "fchmod " + path, lambda p=path: os.fchmod(os.open(p, os.O_RDONLY), 0o777))
    record("metadata", "fchown " + path, lambda p=path: os.fchown(os.open(p, os.O_RDONLY), 0, 0))
    record("write", "open for writing " + path, lambda p=path: os.open(p, os.O_WRONLY | os.O_APPEND))
    record("write", "truncate " + path, lambda p=path: os.truncate(p, 0))
    record("links", "unlink " + path, lambda p=path: os.unlink(p))
    record("links", "hard link " + path, lambda p=path: os.link(p, "/box/linked"))
    record("links", "rename " + path, lambda p=path: os.rename(p, "/box/renamed"))
    record("links", "symlink beside " + path, lambda p=path: os.symlink("/box", p + ".lnk"))
for path in ["/pwned", "/usr/pwned", "/etc/pwned", os.path.dirname(MODEL) + "/pwned", "/proc/pwned"]:
    record("write", "create " + path, lambda p=path: os.open(p, os.O_WRONLY | os.O_CREAT, 0o600))
    record("write", "mkdir " + path, lambda p=path: os.mkdir(p))
record("devices", "mknod /box/mem", lambda: os.mknod("/box/mem", stat.S_IFCHR | 0o666, os.makedev(1, 1)))
record("devices", "mkfifo /box/fifo", lambda: os.mkfifo("/box/fifo"))
record("devices", "open /dev/mem", lambda: os.open("/dev/mem", os.O_RDONLY))
for name, args in [("mount", (0, 0, 0, 0, 0)), ("umount2", (0, 0)), ("pivot_root", (0, 0)), ("chroot", (0,)),
                   ("fsopen", (0, 0)), ("open_tree", (-100, 0, 0)), ("move_mount", (0, 0, 0, 0, 0)),
                   ("mount_setattr", (0, 0, 0, 0, 0))]:
    raw("mounts", name, *args)
for name, args in [("unshare", (0x10000000,)), ("unshare", (0x40000000,)), ("unshare", (0x00020000,)),
                   ("setns", (0, 0)), ("clone", (0x10000000 | 17, 0, 0, 0, 0)), ("clone3", (0, 0))]:
    raw("namespaces", name, *args)
record("namespaces", "setns /proc/self/ns/net", lambda: os.setns(os.open("/proc/self/ns/net", os.O_RDONLY))
       if hasattr(os, "setns") else (_ for _ in ()).throw(OSError(errno.ENOSYS, "no os.setns")))
for pid in [*OTHERS, *HOST_PIDS]:
    raw("ptrace", "ptrace", 16, pid, 0, 0)  # PTRACE_ATTACH
    raw("ptrace", "process_vm_readv", pid, 0, 0, 0, 0, 0)
    raw("ptrace", "kcmp", pid, os.getpid(), 0, 0, 0)
    raw("ptrace", "pidfd_open", pid, 0)
raw("ptrace", "ptrace", 0, 0, 0, 0)  # PTRACE_TRACEME
for pid in HOST_PIDS:
    record("signals", "kill %d" % pid, lambda p=pid: os.kill(p, 0))
record("signals", "kill -1", lambda: os.kill(-1, 0))
for family in sorted(set(socket.AddressFamily), key=int):
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW):
        record("sockets", "socket %s %s" % (family.name, kind.name), lambda f=family, k=kind: socket.socket(f, k))
for number in range(46):  # every family number, named in this Python or not
    raw("sockets", "socket", number, 2, 0)
record("sockets", "socketpair AF_UNIX", lambda: socket.socketpair())
for name, args in [("add_key", (0, 0, 0, 0, -2)), ("request_key", (0, 0, 0, -2)), ("keyctl", (0, -2, 0))]:
    raw("keyrings", name, *args)
raw("bpf", "bpf", 0, 0, 0)
raw("io_uring", "io_uring_setup", 1, 0)
raw("perf", "perf_event_open", 0, 0, -1, -1, 0)
for name, args in [("fanotify_init", (0, 0)), ("userfaultfd", (0,)), ("name_to_handle_at", (-100, 0, 0, 0, 0)),
                   ("open_by_handle_at", (-100, 0, 0)), ("init_module", (0, 0, 0)), ("finit_module", (0, 0, 0)),
                   ("delete_module", (0, 0)), ("kexec_load", (0, 0, 0, 0)), ("reboot", (0, 0, 0, 0)),
                   ("swapon", (0, 0)), ("acct", (0,)), ("settimeofday", (0, 0)), ("clock_settime", (0, 0)),
                   ("adjtimex", (0,)), ("sethostname", (0, 0)), ("setdomainname", (0, 0)), ("iopl", (3,)),
                   ("ioperm", (0, 1, 1)), ("capset", (0, 0)), ("setuid", (0,)), ("setgid", (0,)),
                   ("setresuid", (0, 0, 0)), ("setgroups", (0, 0)), ("quotactl", (0, 0, 0, 0)), ("syslog", (3, 0, 0)),
                   ("vhangup", ()), ("memfd_secret", (0,)), ("process_madvise", (0, 0, 0, 0, 0)),
                   ("pidfd_getfd", (0, 0, 0)), ("pidfd_send_signal", (0, 9, 0, 0)), ("seccomp", (1, 0, 0)),
                   ("lookup_dcookie", (0, 0, 0)), ("uselib", (0,)), ("modify_ldt", (0, 0, 0)), ("chmod", (0, 0)),
                   ("fchmodat", (-100, 0, 0)), ("fchownat", (-100, 0, 0, 0, 0)), ("utimensat", (-100, 0, 0, 0)),
                   ("mknodat", (-100, 0, 0, 0)), ("setxattr", (0, 0, 0, 0, 0)), ("personality", (0x0040000,))]:
    raw("kernel", name, *args)
for path in [*["/proc/%d/%s" % (p, f) for p in OTHERS for f in ("environ", "mem", "cmdline", "root/etc/hostname")],
             "/proc/kcore",
             *["/proc/%d/environ" % p for p in HOST_PIDS], *["/proc/%d/cwd" % p for p in HOST_PIDS],
             "/sys/firmware", "/sys/kernel/security", "/sys/class/net", "/sys/fs/cgroup/cgroup.procs",
             "/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/ssh", "/etc/hostname", "/root/.ssh",
             "/root/.bash_history", "/var", "/run", "/tmp", *VICTIMS, *[os.path.dirname(v) for v in VICTIMS]]:
    record("reads", "read " + path, lambda p=path: os.listdir(p) if os.path.isdir(p) else open(p, "rb").read(64))
fds = {}
for fd in os.listdir("/proc/self/fd"):
    try:
        fds[fd] = os.readlink("/proc/self/fd/" + fd)
    except FileNotFoundError:  # (the listing's own descriptor, closed since)
        continue
    except OSError as error:
        fds[fd] = "?" + str(error)
results.append({"family": "descriptors", "call": "inherited", "ok": None, "detail": fds})
initial = open("/proc/self/environ", "rb").read().split(b"\0")  # (as given at exec: not what torch set since)
results.append({"family": "environment", "call": "environ", "ok": None,
                "detail": sorted(e.split(b"=")[0].decode() for e in initial if e)})
results.append({"family": "identity", "call": "ids", "ok": None,
                "detail": [os.getuid(), os.geteuid(), open("/proc/self/status").read().split("CapEff:")[1].split()[0]]})
with open("__REPORT__", "w") as out:
    json.dump(results, out)
'''


def battery_source(victims: list[str], host_pids: list[int], model: str) -> str:
    """The payload, aimed at ``victims`` (files outside the sandbox that must not change or be read),
    ``host_pids`` (processes outside it) and ``model`` (the model file, read-only inside)."""
    return (_SOURCE.replace("__VICTIMS__", repr(victims)).replace("__PIDS__", repr(host_pids))
            .replace("__MODEL__", repr(model)).replace("__REPORT__", REPORT))


def battery_pt2(path: Path, victims: list[str], host_pids: list[int]) -> Path:
    """A `.pt2` without pickles whose symbolic shape runs the battery when torch loads it."""
    from tests.stages.model_attacks import code_in_shape_expression_pt2

    return code_in_shape_expression_pt2(path, battery_source(victims, host_pids, str(path.absolute())))
