"""The project files a stage's run really uses, recorded while it runs (as a compiler writes a depfile).

The stage of a node with ``python:`` references runs in an observed child of its worker (`execution.worker.run_job`
with `trtflow.readtrace`): every file the child and the processes it starts open, execute or read a link of is
seen by system call, and `add_reads` keys it here. In the child, an import finder placed first on
``sys.meta_path`` sees every module the import system looks for (for the slots below), and
`callables.load_callable` notes the ``python:`` file it executes. Kept, for the node's key (see `plan`):

  files   every file read inside the recipe's roots (its project, ``TRTFLOW_ALLOWED_PATHS``), outside the virtual
          environments and installed packages *below* a root (wherever the project itself lives: a checkout in
          ``<venv>/src/`` is a project like any other), outside trtflow's and the stage's own packages (keyed as the
          stage's code) and outside the store: path -> digest of its content, as of when it was first read; every
          symbolic link inside the roots met on the way to a file read, at any component: path -> its target
          (`path_digest`); every variable the code could see: ``env:NAME`` -> digest of its value;
  absent  module slots ("<folder>/<name>") inside the roots where a module was looked for and not found: for a
          module found nowhere, every such search folder; for a project module, those searched before the one it
          came from. A module created in a slot later would be imported instead, so it is checked like a file.

A project module imported before the run began (a process that runs several nodes) counts as well, with the digest
of the content it was imported with (`_IMPORTED`); one imported outside any recording cannot vouch for its content,
nor can a file that changed while the node ran, nor a run the supervisor could not see whole (`readtrace`): all
are recorded as `CHANGED`, a digest no file has, so the node is rebuilt the next time rather than trusted. A file
read and absent is recorded as `MISSING`. Not seen: folder listings (a file added to a folder the code globs),
whether a path exists when it is only ``stat``-ed, and reads outside the roots.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from trtflow.codehash import not_the_projects
from trtflow.fingerprint import Sig, hash_file_content, signature

CHANGED = "changed-while-running"
MISSING = "missing"  # plan.MISSING: what a file that is not there hashes to


@dataclass
class Deps:
    """What one run of a stage imported from the project (absolute, real paths)."""

    files: dict[str, str] = field(default_factory=dict)  # module file -> content digest (or CHANGED)
    absent: list[str] = field(default_factory=list)  # "<folder>/<module name>" slots searched and empty
    roots: list[str] = field(default_factory=list)  # where project files are (the recording's, when it ended)
    excluded: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"files": dict(sorted(self.files.items())), "absent": sorted(self.absent)}

    def with_places(self) -> dict[str, Any]:
        return {**self.as_json(), "roots": self.roots, "excluded": self.excluded}

    @classmethod
    def from_json(cls, data: Any) -> Deps | None:
        """The deps a worker reported; None when the report is missing or malformed."""
        if not isinstance(data, dict):
            return None
        files, absent = data.get("files"), data.get("absent")
        if not (isinstance(files, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())
                and isinstance(absent, list) and all(isinstance(a, str) for a in absent)):
            return None
        roots, excluded = data.get("roots", []), data.get("excluded", [])
        return cls(dict(files), list(absent), [str(r) for r in roots], [str(e) for e in excluded])


def slot_taken(slot: str) -> bool:
    """Whether a module named like the slot's last part now exists in its folder (a file with any suffix Python
    imports, or a package folder)."""
    from importlib.machinery import all_suffixes

    return os.path.isdir(slot) or any(os.path.lexists(slot + suffix) for suffix in all_suffixes())


class _Recording:
    def __init__(self, roots: Iterable[str | os.PathLike[str]], excluded: Iterable[str | os.PathLike[str]]) -> None:
        self.roots = [os.path.realpath(r) for r in roots]
        self.excluded = [os.path.realpath(e) for e in excluded]
        self.files: dict[str, tuple[Sig, str]] = {}
        self.lookups: list[tuple[str, list[str], str | None, bool]] = []  # name, searched, origin, found

    def relevant(self, path: str) -> bool:
        if any(path == e or path.startswith(e + os.sep) for e in self.excluded):
            return False
        for root in self.roots:
            if path == root or path.startswith(root + os.sep):
                return not not_the_projects(root, os.path.relpath(path, root).split(os.sep)[:-1])
        return False

    def note(self, path: str) -> None:
        real = os.path.realpath(path)
        if real in self.files or not self.relevant(real):
            return
        try:
            st = os.stat(real)
            if not stat.S_ISREG(st.st_mode):
                return
            digest = hash_file_content(real)  # type: ignore[arg-type]
        except OSError:
            return
        self.files[real] = (signature(st), digest)
        _IMPORTED[real] = (signature(st), digest)

    def finish(self) -> Deps:
        deps = Deps()
        for path, (sig, digest) in self.files.items():
            try:
                now = signature(os.stat(path))
            except OSError:
                deps.files[path] = MISSING
                continue
            deps.files[path] = digest if now == sig else CHANGED
        folders: dict[str, str] = {}  # a module's folder -> its real path (thousands of modules, few folders)
        for name, module in list(sys.modules.items()):  # imported before the run began, used again by it
            file = getattr(module, "__file__", None)
            # a module object may carry a made-up __file__ (torch.ops says "_ops.py"): only real absolute files
            if (not isinstance(file, str) or not os.path.isabs(file) or name in ("__main__", "__mp_main__")
                    or not os.path.isfile(file)):
                continue
            folder, base = os.path.split(file)
            if folder not in folders:
                folders[folder] = os.path.realpath(folder)
            real = os.path.join(folders[folder], base)
            if os.path.islink(real):
                real = os.path.realpath(real)
            if real not in deps.files and self.relevant(real):
                deps.files[real] = _IMPORTED[real][1] if real in _IMPORTED else CHANGED
        deps.absent = sorted({slot for lookup in self.lookups for slot in self._slots(*lookup)})
        return deps

    def _slots(self, name: str, searched: list[str], origin: str | None, found: bool) -> list[str]:
        if found and (origin is None or not self.relevant(os.path.realpath(origin))):
            return []  # a namespace package, or a module from outside the project: the environment's business
        last = name.rpartition(".")[2]
        home = None
        if origin is not None:  # where it was found, as spelled (a module that is a link lives beside its link)
            folder = os.path.dirname(origin)
            home = os.path.realpath(os.path.dirname(folder) if os.path.basename(origin).startswith("__init__.")
                                    else folder)
        slots = []
        for folder in searched:
            folder = os.path.realpath(folder or os.getcwd())
            if folder == home:
                break
            slot = os.path.join(folder, last)
            if self.relevant(slot):
                slots.append(slot)
        return slots


_LOCK = threading.Lock()
_ACTIVE: dict[int, _Recording] = {}  # thread -> its recording (several nodes may run in one process)
_IMPORTED: dict[str, tuple[Sig, str]] = {}  # module file -> signature and digest it was imported with


class _Finder:
    """First on ``sys.meta_path`` while a recording is active: asks the finders after it, notes what they found."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        recording = _ACTIVE.get(threading.get_ident())
        if recording is None:
            return None
        searched = list(path) if path is not None else list(sys.path)
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        origin = spec.origin if spec is not None and spec.has_location else None
        recording.lookups.append((fullname, searched, origin, spec is not None))
        if origin is not None:
            recording.note(origin)
        return spec


_FINDER = _Finder()


def note_entry(path: str | os.PathLike[str]) -> None:
    """The file a ``python:`` reference names, about to run (`callables.load_callable`): counted as imported (a
    ``python:`` file is executed, not imported), read now, before its code runs; its folder joins the roots, so the
    modules beside it count wherever the reference points (a module of an installed package, too)."""
    recording = _ACTIVE.get(threading.get_ident())
    if recording is not None:
        real = os.path.realpath(path)
        folder = os.path.dirname(real)
        if folder not in recording.roots:
            recording.roots.append(folder)
        recording.note(real)


@contextmanager
def recording(roots: Iterable[str | os.PathLike[str]], excluded: Iterable[str | os.PathLike[str]] = ()
              ) -> Iterator[Deps]:
    """Record what this thread imports inside the block; the yielded `Deps` is filled in when the block ends
    (also when it raises)."""
    deps = Deps()
    current = _Recording(roots, excluded)
    thread = threading.get_ident()
    with _LOCK:
        _ACTIVE[thread] = current
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
    try:
        yield deps
    finally:
        with _LOCK:
            _ACTIVE.pop(thread, None)
            if not _ACTIVE and _FINDER in sys.meta_path:
                sys.meta_path.remove(_FINDER)
        finished = current.finish()
        deps.files, deps.absent = finished.files, finished.absent
        deps.roots, deps.excluded = list(current.roots), list(current.excluded)


# ------------------------------------------------------------------------------- reads seen by system call
ENV_LABEL = "env:"
LINK = "link:"
FOLDER = "folder"
#: the variables a node's python: code sees besides those TRTFLOW_PASS_ENV names (all keyed by value)
PASSED_ENV = ("LANG", "LC_ALL", "LC_CTYPE", "TZ")
#: visible, not keyed by value: where programs, libraries, modules, the home folder and temporary files are looked
#: up. What they change is which files the code opens or executes, and each of those is keyed as it is read (a
#: project file by its content; files outside the project are the environment's, as they are for every node), so
#: keying their values would only rebuild every python: node when a virtual environment is activated.
SEARCH_ENV = ("HOME", "PATH", "TMPDIR", "LD_LIBRARY_PATH", "PYTHONPATH")
#: visible too, set by the executor for the node, not keyed: which GPU a node got is scheduling (the key has the
#: facts of the device it runs on); so are trtflow's own settings that a node reads (`settings.NODE_SETTINGS`),
#: and no other (the signing key is never there)
EXECUTOR_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "PYTHONUNBUFFERED")
PASS_ENV = "TRTFLOW_PASS_ENV"


_VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")


def named_in(params: Any) -> list[str]:
    """The variables a node's parameters spell (``$VAR``, ``${VAR}``: a path the stage resolves when it runs)."""
    if isinstance(params, str):
        return _VAR.findall(params)
    if isinstance(params, dict):
        return [n for v in params.values() for n in named_in(v)]
    if isinstance(params, list | tuple):
        return [n for v in params for n in named_in(v)]
    return []


def keyed_env_names(environ: Mapping[str, str] | None = None, named: Iterable[str] = ()) -> list[str]:
    """The environment variables a node's python: code sees, each keyed by its value: `PASSED_ENV`, those the
    node's parameters spell (``named``) and those ``TRTFLOW_PASS_ENV`` names (comma-separated; trtflow's own
    settings only where a node may see them: the signing key never). The settings of `settings.NODE_SETTINGS` and
    `EXECUTOR_ENV` are visible too, unkeyed."""
    from trtflow.settings import node_setting

    environ = os.environ if environ is None else environ
    passed = [n.strip() for n in environ.get(PASS_ENV, "").split(",") if n.strip()]
    return sorted(n for n in {*PASSED_ENV, *passed, *named} if node_setting(n))


def code_environment(environ: Mapping[str, str] | None = None, named: Iterable[str] = ()) -> dict[str, str]:
    """The keyed part of the environment the code runs with, and trtflow's settings that a node reads (an
    allow-list: `settings.NODE_SETTINGS`)."""
    from trtflow.settings import NODE_SETTINGS

    environ = os.environ if environ is None else environ
    shown = {n: environ[n] for n in keyed_env_names(environ, named) if n in environ}
    shown.update({n: environ[n] for n in sorted(NODE_SETTINGS) if n in environ})
    return shown


def run_environment(code_env: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of the code's process: ``code_env``, and the executor's variables (`EXECUTOR_ENV`)
    and the search paths (`SEARCH_ENV`) as this process has them. Nothing else is there."""
    environ = os.environ if environ is None else environ
    return {**{n: environ[n] for n in (*EXECUTOR_ENV, *SEARCH_ENV) if n in environ}, **code_env}


def env_digest(label: str, environ: Mapping[str, str] | None = None) -> str:
    """The digest of an ``env:NAME`` label: the variable's value now (`MISSING`: unset), as a keyed digest
    (`storage.verified.keyed_digest`: an HMAC under this user's secret, which is not in the store): the value may
    be a secret passed to the code, and the digest is written into manifests, which whoever reads the store reads;
    a plain hash of a short secret is undone by trying values. Without that secret (a configuration folder that
    cannot be written), a digest no other call gives: such a node is rebuilt on every run, never reused."""
    from trtflow.storage.verified import keyed_digest

    name = label[len(ENV_LABEL):]
    value = (os.environ if environ is None else environ).get(name)
    if value is None:
        return MISSING
    return keyed_digest("env", name, value) or f"unkeyed:{os.urandom(16).hex()}"


def path_digest(path: str | os.PathLike[str], stat_cache: Any = None) -> str:
    """What a path the code used is keyed by, as it is now: a symbolic link by its target as written (whatever
    it resolves to: the file it resolves to is keyed by its own path), a regular file by its content, a folder
    as such; anything else (gone, a pipe) `MISSING`."""
    from pathlib import Path

    from trtflow.fingerprint import hash_file, hash_text

    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            return LINK + hash_text(os.readlink(path))
        if stat.S_ISDIR(st.st_mode):
            return FOLDER
        if stat.S_ISREG(st.st_mode):
            return hash_file(Path(path), stat_cache) if stat_cache is not None else hash_file_content(path)  # type: ignore[arg-type]
    except OSError:
        pass
    return MISSING


def label_digest(label: str, path: Any, stat_cache: Any = None) -> str:
    """The digest of a recorded label now (``path``: where it points; None: nowhere)."""
    if label.startswith(ENV_LABEL):
        return env_digest(label)
    return MISSING if path is None else path_digest(path, stat_cache)


def _add_source(deps: Deps, cached: str, recording: _Recording) -> None:
    from importlib.util import source_from_cache

    try:
        source = os.path.realpath(source_from_cache(cached))
    except ValueError:
        return
    if source not in deps.files and recording.relevant(source):
        deps.files[source] = path_digest(source) if os.path.isfile(source) else MISSING


def add_reads(deps: Deps, reads: Any, environ: Mapping[str, str] | None = None, named: Iterable[str] = ()) -> None:
    """Key what the observed process tree read (`readtrace.Reads`) and the environment it saw, into ``deps``:
    every file inside the roots it opened (by content, `CHANGED` if it changed while the code ran, `MISSING` if it
    was not there), every link inside the roots on the way to any file it opened (by target), every variable it
    could see (by value). A run the supervisor could not see whole is recorded as changed."""
    recording = _Recording(deps.roots, deps.excluded)
    for link, target in reads.links.items():
        if recording.relevant(link):
            try:
                same = os.readlink(link) == target
            except OSError:
                same = False
            deps.files[link] = path_digest(link) if same else CHANGED
    for path, sig in reads.files.items():
        if path.endswith(".pyc"):  # a module's cached code (its source was only stat-ed): the source counts
            _add_source(deps, path, recording)
            continue
        if path in deps.files or not recording.relevant(path):
            continue
        if sig is None:
            deps.files[path] = MISSING if path_digest(path) in (MISSING, FOLDER) else CHANGED
            continue
        try:
            st = os.stat(path)
            before = signature(st)
            digest = hash_file_content(path)
            same = tuple(sig) == before == signature(os.stat(path))
        except OSError:
            same = False
        deps.files[path] = digest if same else CHANGED
    for name in keyed_env_names(environ, named):
        deps.files[ENV_LABEL + name] = env_digest(ENV_LABEL + name, environ)
    for why in reads.blind[:1]:
        deps.files[f"(not observed: {why})"] = CHANGED
