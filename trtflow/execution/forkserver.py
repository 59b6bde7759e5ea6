"""A warm server that forks one process per node: isolation without paying Python's start-up every time.

Each node still runs in a process of its own (a crash, a hang or a leak cannot harm the run), but the process
is forked from a server that has already imported the heavy libraries the stages declare (`Stage.preload`,
e.g. torch, onnx, onnxruntime), never initialising CUDA, and it leaves with ``os._exit`` once its result is
durable. The server starts isolated: the caller's working directory is not on its module path, so a
``logging.py`` or a ``trtflow/`` folder there shadows nothing.

Protocol: the runner sends ``{"op": "spawn", "id", "env", "preload", "stage"}`` as one packet on the server's
stdin (a ``SOCK_SEQPACKET`` socket) with two descriptors (``SCM_RIGHTS``): the node's scratch folder and its log,
both opened by the runner (the node never opens either by name: see `trtflow.storage.confined.folders`); the
server answers on stdout (JSON lines) ``{"id", "pid"}`` after forking and ``{"id", "exit", "maxrss"}`` when the
child has been reaped (``exit``: exit code, or minus the signal number).

``{"op": "prefetch", "modules"}`` (no descriptors): modules the run's later nodes will preload, in the order they
are needed. The server imports them one at a time while it has nothing else to do (no request waiting), so the
imports run on an idle core while the first nodes work instead of in front of each node's start; a spawn request
waits at most for the one import in progress. What a spawn needs and is not imported yet it still imports first.
While a node that runs alone (``"alone": true`` in its spawn: an exclusive node, e.g. a benchmark) is running, the
server imports nothing ahead: it would be the work beside it that exclusive rules out.

The server runs with Python's cyclic collector off (importing a library makes objects that live as long as the
server, in few cycles) and freezes what it holds before each fork (``gc.freeze``): a node's collections never scan
the libraries it was forked with, and the pages it shares with the server stay shared. The node turns the collector
on before its stage runs.
"""

from __future__ import annotations

import gc
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import traceback
from dataclasses import dataclass, field
from typing import IO, Any

from trtflow.settings import node_environment

# `python -c` puts the working directory first on sys.path: take it off before importing anything else.
BOOTSTRAP = ("import gc, sys\ngc.disable()\nif sys.path and sys.path[0] == '': del sys.path[0]\n"
             "from trtflow.execution.forkserver import serve\nserve()")
# The same isolation for a node process started directly (no fork server).
WORKER_BOOTSTRAP = ("import sys\nif sys.path and sys.path[0] == '': del sys.path[0]\n"
                    "from trtflow.execution import worker\nworker.exit_now(worker.main(int(sys.argv[1])))")


def isolated_python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


# --------------------------------------------------------------------------------------------- the server side
def serve() -> None:
    from trtflow.execution.worker import die_with_parent

    die_with_parent(int(os.environ.get("TRTFLOW_FORKSERVER_PARENT", "0")))
    _warm_engine()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the runner decides what a Ctrl-C stops
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, int] = {}  # pid -> job id
    control = socket.socket(fileno=os.dup(0))
    control.setblocking(True)
    selector = selectors.DefaultSelector()
    selector.register(control.fileno(), selectors.EVENT_READ, "control")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    ahead: list[str] = []  # modules to import while idle (`prefetch`)
    alone: set[int] = set()  # children that run alone: nothing is imported ahead beside them
    while True:
        alone.intersection_update(children)  # those reaped run no more
        idle = bool(ahead) and not alone
        ready = selector.select(timeout=0 if idle else None)
        if not ready and idle:
            _preload([ahead.pop(0)])
            continue
        for key, _ in ready:
            if key.data == "child":
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
                _reap(children)
                continue
            packet, fds, _flags, _addr = socket.recv_fds(control, 1 << 20, 2)
            if not packet:  # the runner went away
                for pid in list(children):
                    _kill_group(pid)
                os._exit(0)
            try:
                message = json.loads(packet)
                if message.get("op") == "spawn" and len(fds) == 2:
                    pid = _spawn(message, fds, children, [0, control.fileno(), wake_r, wake_w])
                    if message.get("alone"):
                        alone.add(pid)
                elif message.get("op") == "prefetch":
                    ahead += [str(name) for name in message.get("modules") or [] if name not in ahead]
            finally:
                for fd in fds:
                    os.close(fd)
        _reap(children)


def _reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _warm_engine() -> None:
    """What every node process needs, done once here: the worker, the stage contract, the stage registry."""
    try:
        from trtflow.execution import worker  # noqa: F401
        from trtflow.registry import stage_entry_points

        stage_entry_points()
    except Exception as exc:  # a node process then does it (and reports what fails)
        print(f"trtflow fork server: warming up failed: {type(exc).__name__}: {exc}", file=sys.stderr)


def _load_stage(name: str | None) -> None:
    """Import the node's stage module once here (stage modules are cheap to import by contract)."""
    if not name:
        return
    try:
        from trtflow.registry import get_stage

        get_stage(name)
    except Exception:  # the node process imports it again and reports the error properly
        return


def _preload(modules: list[str]) -> None:
    import importlib

    for name in modules:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except BaseException as exc:  # a module that fails to import here is imported (and fails) in the node
            print(f"trtflow fork server: preloading {name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)


def _spawn(message: dict[str, Any], fds: list[int], children: dict[int, int], server_fds: list[int]) -> int:
    scratch_fd, log_fd = fds
    _preload(list(message.get("preload") or []))
    _load_stage(message.get("stage"))
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()  # what the server holds is never scanned by the node's collections
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            _become_node(message, log_fd, server_fds)
            from trtflow.execution import worker

            code = worker.main(scratch_fd)
        except BaseException:
            traceback.print_exc()
        finally:
            from trtflow.execution.worker import exit_now

            exit_now(code)
    children[pid] = message["id"]
    _reply({"id": message["id"], "pid": pid, "base_rss": _own_rss()})
    return pid


def _become_node(message: dict[str, Any], log: int, server_fds: list[int]) -> None:
    server_pid = os.getppid()
    os.setsid()
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    for fd in {log, null, *server_fds} - {0, 1, 2}:
        try:
            os.close(fd)
        except OSError:
            pass
    for name, value in (message.get("env") or {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    from trtflow.environment import gpus
    from trtflow.execution.worker import die_with_parent

    gpus.cache_clear()  # the node may see another set of GPUs than the server
    die_with_parent(server_pid)
    gc.enable()  # off in the server only


def _own_rss() -> int:
    """This server's resident memory, which a forked node shares until it writes to it."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return 0
    return 0


def _reap(children: dict[int, int]) -> None:
    while children:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        job_id = children.pop(pid, None)
        if job_id is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        _reply({"id": job_id, "exit": code, "maxrss": usage.ru_maxrss * 1024})


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


# --------------------------------------------------------------------------------------------- the runner side
@dataclass
class Child:
    id: int
    started: threading.Event = field(default_factory=threading.Event)
    exited: threading.Event = field(default_factory=threading.Event)
    pid: int | None = None
    exit_code: int | None = None
    maxrss: int | None = None
    base_rss: int = 0  # the server's memory the node started out sharing


class ServerGone(RuntimeError):
    """The fork server died (e.g. a library crashed while it was being preloaded)."""


class ForkServerClient:
    """Starts the server (from the main thread: Linux ties a child's parent-death signal to the thread that
    started it) and hands out children to runner threads."""

    def __init__(self, stderr: IO[Any] | int | None = None) -> None:
        env = dict(node_environment(), TRTFLOW_FORKSERVER_PARENT=str(os.getpid()))  # no signing key, no setting
        # that is not a node's: the nodes it forks keep this environment, /proc/<pid>/environ included
        self._control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(isolated_python(BOOTSTRAP), stdin=theirs.fileno(), stdout=subprocess.PIPE,
                                          stderr=stderr, env=env, start_new_session=True)
        finally:
            theirs.close()
        self._lock = threading.Lock()
        self._children: dict[int, Child] = {}
        self._next = 0
        self._reader = threading.Thread(target=self._read, name="trtflow-forkserver", daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def spawn(self, scratch_fd: int, log_fd: int, env: dict[str, str | None], preload: list[str],
              stage: str | None = None, alone: bool = False) -> Child:
        """Start a node in a fork of the server, handing it the descriptors of its scratch folder and its log
        (``alone``: the node runs alone; the server imports nothing ahead while it runs)."""
        with self._lock:
            self._next += 1
            child = Child(self._next)
            self._children[child.id] = child
            message = {"op": "spawn", "id": child.id, "env": env, "preload": preload, "stage": stage,
                       "alone": alone}
            try:
                socket.send_fds(self._control, [json.dumps(message).encode()], [scratch_fd, log_fd])
            except (BrokenPipeError, OSError, ValueError):
                self._children.pop(child.id, None)
                raise ServerGone("the fork server is gone") from None
        while not child.started.wait(0.2):
            if not self.alive:
                raise ServerGone(f"the fork server exited with code {self._proc.returncode}")
        if child.pid is None:
            raise ServerGone("the fork server stopped before starting the node")
        return child

    def prefetch(self, modules: list[str]) -> None:
        """Have the server import ``modules`` (the later nodes' preloads, in the order needed) while it is idle.
        Best effort: a server that is gone is found out by the next spawn."""
        with self._lock:
            try:
                self._control.send(json.dumps({"op": "prefetch", "modules": modules}).encode())
            except OSError:
                pass

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            child = self._children.get(message.get("id"))
            if child is None:
                continue
            if "pid" in message:
                child.pid = message["pid"]
                child.base_rss = int(message.get("base_rss") or 0)
                child.started.set()
            elif "exit" in message:
                child.exit_code = message["exit"]
                child.maxrss = message.get("maxrss")
                child.exited.set()
                with self._lock:
                    self._children.pop(child.id, None)
        for child in list(self._children.values()):  # the server died: nothing more will be reported
            child.started.set()
            child.exited.set()

    def close(self) -> None:
        try:
            self._control.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
