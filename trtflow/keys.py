"""Builder identities: ed25519 signing keys, and which public keys a project trusts (and has revoked).

Each builder (a user, a CI job) has its own key; nothing is shared between builders (a shared secret would let
anyone who holds it, a pull-request job included, sign for everyone).

Where keys live:
  $XDG_CONFIG_HOME/trtflow/keys/<name>.key   a private key (PKCS#8 PEM), mode 0600, in a folder of mode 0700
  $XDG_CONFIG_HOME/trtflow/keys/public/<name>.pub   its public key (own keys are trusted from these)
  $XDG_CONFIG_HOME/trtflow/keys/default      the name of the key results are signed with
  $XDG_CONFIG_HOME/trtflow/trust.yaml        public keys this user trusts (or has revoked) in every project
  <project>/trtflow-trust.yaml               public keys the project trusts and has revoked (committed, reviewed)
  TRTFLOW_SIGNING_KEY / TRTFLOW_SIGNING_KEY_FILE   a CI job's secret key (text of `trtflow keys show --secret`),
                                             taken from its secret store and never written anywhere

A public key is written as Nix writes its cache keys, ``NAME:BASE64`` (the 32 raw bytes); a key's id is the first
16 hex digits of the sha256 of those bytes. Ids are only for lookup: a signature is always checked against the
full public key the trust files name, so an id that collides names no key that verifies.

Trust: the keys of the project file, of the user's file, and the user's own keys; minus every key revoked in
either file (a revoked key is never trusted, one's own included, whatever the dates on its results).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtflow.errors import TrtflowError, UsageError
from trtflow.settings import SIGNING_KEY, SIGNING_KEY_FILE
from trtflow.userfiles import Refused, load_yaml, own_folder, read_file, write_file, write_in

if TYPE_CHECKING:  # cryptography loads where a key signs or a signature is checked, not on a no-op run's path
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

PROJECT_FILE = "trtflow-trust.yaml"
USER_FILE = "trust.yaml"
ENV_KEY, ENV_KEY_FILE = SIGNING_KEY, SIGNING_KEY_FILE  # withheld from nodes and recipes (`trtflow.settings`)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}")
MAX_FILE = 1 << 20  # a trust file or key file larger than this is not read


def config_base() -> Path:
    """Where the user keeps configuration, as the user named it (XDG_CONFIG_HOME, else ~/.config from HOME): links
    in its own path are followed (the user chose it); below it, trtflow's folders are its own (`key_folder`)."""
    return Path(os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config"))


def config_dir() -> Path:
    return config_base() / "trtflow"


def keys_dir() -> Path:
    return config_dir() / "keys"


def key_id(raw_public: bytes) -> str:
    return hashlib.sha256(raw_public).hexdigest()[:16]


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise UsageError(f"key name {name!r} is not usable",
                         hint="use letters, digits and . _ @ + - (at most 64), e.g. alice@laptop or ci-main")
    return name


@dataclass(frozen=True)
class PublicKey:
    name: str
    raw: bytes

    @property
    def id(self) -> str:
        return key_id(self.raw)

    @property
    def text(self) -> str:
        return f"{self.name}:{base64.b64encode(self.raw).decode()}"

    def verifies(self, signature: bytes, data: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature

        try:
            _loaded(self.raw).verify(signature, data)
        except (InvalidSignature, ValueError):
            return False
        return True

    @classmethod
    def parse(cls, text: str, where: str = "") -> PublicKey:
        """``NAME:BASE64`` (what `trtflow keys show` prints)."""
        name, sep, b64 = str(text).strip().rpartition(":")
        try:
            raw = base64.b64decode(b64, validate=True) if sep else b""
        except ValueError:
            raw = b""
        if not sep or not NAME.fullmatch(name) or len(raw) != 32:
            raise UsageError(f"{where or 'public key'} {str(text)[:120]!r} is not a public key",
                             hint="write it as `trtflow keys show` prints it: NAME:BASE64")
        return cls(name, raw)


@functools.lru_cache(maxsize=256)
def _loaded(raw: bytes) -> Ed25519PublicKey:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    return Ed25519PublicKey.from_public_bytes(raw)


@dataclass(frozen=True)
class Signer:
    """A private key results are signed with."""

    name: str
    private: Ed25519PrivateKey = field(repr=False)
    source: str = ""  # where it came from (shown, never the key)

    @property
    def public(self) -> PublicKey:
        from cryptography.hazmat.primitives import serialization

        raw = self.private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return PublicKey(self.name, raw)

    def sign(self, data: bytes) -> bytes:
        return self.private.sign(data)

    @property
    def secret_text(self) -> str:
        """``NAME:BASE64`` of the 32-byte seed: what a CI secret holds (TRTFLOW_SIGNING_KEY)."""
        from cryptography.hazmat.primitives import serialization

        seed = self.private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                          serialization.NoEncryption())
        return f"{self.name}:{base64.b64encode(seed).decode()}"


def parse_secret(text: str, where: str) -> Signer:
    """A private key from ``NAME:BASE64SEED`` or a PKCS#8 PEM (whose name is ``where``'s file name)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    text = text.strip()
    if text.startswith("-----BEGIN"):
        try:
            key = serialization.load_pem_private_key(text.encode(), password=None)
        except (ValueError, TypeError):
            key = None
        if not isinstance(key, Ed25519PrivateKey):
            raise TrtflowError(f"{where} holds no usable ed25519 private key",
                               hint="create one with `trtflow keys create NAME`")
        return Signer(Path(where).stem if where.endswith(".key") else "key", key, where)
    name, sep, b64 = text.rpartition(":")
    try:
        seed = base64.b64decode(b64, validate=True)
    except ValueError:
        seed = b""
    if not sep or not NAME.fullmatch(name) or len(seed) != 32:
        raise TrtflowError(f"{where} is not a signing key (expected NAME:BASE64, as `trtflow keys show --secret` "
                           "prints it)", hint=f"set {ENV_KEY} to the secret of a key, or unset it")
    return Signer(name, Ed25519PrivateKey.from_private_bytes(seed), where)


# ----------------------------------------------------------------------------- the user's key store
def _read_small(path: Path, follow: bool = False) -> str:
    """A key or trust file trtflow finds by itself (the user's key store, the project's and the user's trust file):
    a regular file, not a link, at most MAX_FILE bytes (`trtflow.userfiles.read_file`: a named pipe or a link to
    /dev/stdin is refused, never waited on). Raises OSError (`Refused`)."""
    return read_file(path, MAX_FILE, follow=follow).decode("utf-8", "replace")


@contextlib.contextmanager
def key_folder(*, create: bool = False, public: bool = False) -> Iterator[int | None]:
    """The user's key folder (``public``: its ``public/`` folder) open as a descriptor, None when absent and not
    ``create``: `trtflow.userfiles.own_folder` below `config_base` (each of trtflow/, keys/, public/ opened
    without following a link, this user's, writable by nobody else; keys/ and public/ set to 0700). Every file of
    the key store is read and written relative to it. A folder that is refused is an error naming it and the fix."""
    parts = ("trtflow", "keys", *(("public",) if public else ()))
    try:
        with own_folder(config_base(), parts, create=create, private_from=1) as fd:
            yield fd
    except Refused as exc:
        raise TrtflowError(f"the key folder: {exc.message}", hint=exc.hint) from None


def _read_in(folder: int, name: str, shown: Path, cap: int = MAX_FILE, owner_only: bool = False) -> bytes:
    """The file ``name`` of the key folder open as ``folder``: regular, not a link, at most ``cap`` bytes."""
    return read_file(name, cap, follow=False, owner_only=owner_only, folder=folder, shown=shown)


def create_key(name: str, *, make_default: bool | None = None) -> Signer:
    """Create the key ``name`` in the user's key store (0600); the default key if asked, or if there is none."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    check_name(name)
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    path = keys_dir() / f"{name}.key"
    try:  # put-if-absent, whole: a concurrent reader never sees half a key
        with key_folder(create=True) as folder:
            assert folder is not None
            write_in(folder, path.name, pem, mode=0o600, exclusive=True)
    except FileExistsError:
        raise UsageError(f"a key named {name!r} exists ({path})", hint="choose another name, or use it") from None
    signer = Signer(name, private, str(path))
    _write_public(signer.public)
    if make_default or (make_default is None and default_name() is None):
        set_default(name)
    return signer


def public_dir() -> Path:
    """The public halves of the user's keys (what trust and a no-op run's evidence read: never a private key)."""
    return keys_dir() / "public"


def _write_public(pub: PublicKey) -> None:
    with key_folder(create=True, public=True) as folder:
        assert folder is not None
        write_in(folder, f"{pub.name}.pub", (pub.text + "\n").encode())


def private_secret(name: str, create: bool = False) -> bytes | None:
    """The 32 random bytes of the user's secret file ``name`` in the key folder (`storage.verified`'s secret);
    made (0600, whole, put-if-absent) when absent and ``create``. None when absent, not a regular file of this user
    that only this user may read, not 32 bytes, or not makeable (a read-only configuration); a key folder that is
    refused (a link, another user's, writable by others) is an error (`key_folder`)."""
    try:
        with key_folder(create=False) as folder:
            data = None if folder is None else _read_secret(folder, name)
        if data is None and create:
            with key_folder(create=True) as folder:
                assert folder is not None
                with contextlib.suppress(FileExistsError):  # two processes making it at once read the one that won
                    write_in(folder, name, os.urandom(32), mode=0o600, exclusive=True)
                data = _read_secret(folder, name)
    except TrtflowError:
        raise
    except OSError:
        return None
    return data


def _read_secret(folder: int, name: str) -> bytes | None:
    try:
        data = _read_in(folder, name, keys_dir() / name, cap=32, owner_only=True)
    except OSError:
        return None
    return data if len(data) == 32 else None


def own_public_keys() -> list[PublicKey]:
    """The public keys of the user's key store (a key made before they were kept is added on reading it)."""
    found: list[PublicKey] = []
    with key_folder(public=True) as folder:
        if folder is None:
            return found
        for name in sorted(n for n in os.listdir(folder) if n.endswith(".pub")):
            try:
                text = _read_in(folder, name, public_dir() / name).decode("utf-8", "replace")
                found.append(PublicKey.parse(text, str(public_dir() / name)))
            except (OSError, TrtflowError):
                continue
    return found


def set_default(name: str) -> None:
    load_key(name)  # it exists and is usable
    with key_folder(create=True) as folder:
        assert folder is not None
        write_in(folder, "default", (name + "\n").encode())


def default_name() -> str | None:
    with key_folder() as folder:
        try:
            name = "" if folder is None else _read_in(folder, "default", keys_dir() / "default").decode(
                "utf-8", "replace").strip()
        except OSError:
            return None
    return name if NAME.fullmatch(name) else None


def load_key(name: str) -> Signer:
    path = keys_dir() / f"{check_name(name)}.key"
    with key_folder() as folder:
        try:
            if folder is None:
                raise FileNotFoundError(path)
            st = os.stat(path.name, dir_fd=folder, follow_symlinks=False)
            text = _read_in(folder, path.name, path).decode("utf-8", "replace")
        except OSError:
            raise UsageError(f"no key named {name!r} in {keys_dir()}",
                             hint="`trtflow keys list` shows your keys; `trtflow keys create NAME` makes one"
                             ) from None
    if st.st_mode & 0o077:
        raise TrtflowError(f"the key file {path} may be read by others (mode {st.st_mode & 0o777:o})",
                           hint=f"chmod 600 {path}; if others did read it, revoke the key (`trtflow keys revoke`)")
    signer = Signer(name, parse_secret(text, str(path)).private, str(path))
    if not _exists(f"{name}.pub", public=True):
        _write_public(signer.public)
    return signer


def _exists(name: str, public: bool = False) -> bool:
    """Whether the key folder (``public``: its public/) has an entry ``name`` (a link counts; never followed)."""
    with key_folder(public=public) as folder:
        if folder is None:
            return False
        try:
            os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            return False
    return True


def own_keys() -> list[Signer]:
    """The user's keys (those whose file cannot be used are left out: `trtflow keys list` says why)."""
    with key_folder() as folder:
        names = [] if folder is None else sorted(n[:-4] for n in os.listdir(folder) if n.endswith(".key"))
    found = []
    for name in names:
        try:
            found.append(load_key(name))
        except TrtflowError:
            continue
    return found


_signer_lock = threading.Lock()
_signer_cache: dict[tuple[str, ...], Signer] = {}
#: TRTFLOW_SIGNING_KEY as `take_signing_key` found it at the CLI's start (a list of one: taken; empty: not taken)
_taken: list[str | None] = []


def take_signing_key() -> str | None:
    """Move TRTFLOW_SIGNING_KEY from the environment into this module's memory: the CLI's first act, before any
    process (the fork server, a node, Ray) starts. It is removed from ``os.environ`` (no child inherits it) and its
    value bytes in this process's original environment block are overwritten (`trtflow.procenv.erase`), so neither
    ``/proc/<pid>/environ`` of this process nor that of a process forked from it holds it. Returns a warning when
    the block could not be erased (the key is then still readable there by this user's processes)."""
    from trtflow import procenv

    value = os.environ.pop(ENV_KEY, None)
    _taken[:] = [value]
    if procenv.erase(ENV_KEY) or value is None:  # no key given: nothing to warn of, whatever /proc allows
        return None
    return (f"{ENV_KEY} could not be erased from this process's environment block: processes of this user (a "
            f"node's code) may read it in /proc/{os.getpid()}/environ; give the key in a file instead "
            f"({ENV_KEY_FILE})")


def forget_signing_key() -> None:
    """Drop what `take_signing_key` took (the CLI's end: a caller that runs it in its own process, a test, reads
    the environment again afterwards)."""
    _taken.clear()
    with _signer_lock:
        _signer_cache.clear()


def _env_key() -> str | None:
    """The signing key given in the environment: as `take_signing_key` took it, else as os.environ holds it."""
    return _taken[0] if _taken else os.environ.get(ENV_KEY)


def current_signer() -> Signer:
    """The key this process signs results with: TRTFLOW_SIGNING_KEY, TRTFLOW_SIGNING_KEY_FILE, the user's default
    key; made (``USER@HOST``) on first use when there is none."""
    env, env_file = _env_key(), os.environ.get(ENV_KEY_FILE)
    memo = (str(env), str(env_file), str(config_dir()))
    with _signer_lock:
        if memo in _signer_cache:
            return _signer_cache[memo]
        if env:
            signer = parse_secret(env, ENV_KEY)
        elif env_file:
            try:
                text = _read_small(Path(env_file), follow=True)  # named by the user (a mounted secret is a link)
            except OSError as exc:
                raise TrtflowError(f"{ENV_KEY_FILE}={env_file}: {exc.strerror or exc}",
                                   hint="point it at the key file CI wrote from its secret store") from None
            signer = parse_secret(text, env_file)
        else:
            name = default_name()
            signer = load_key(name) if name is not None else _first_key()
        _signer_cache[memo] = signer
        return signer


def _first_key() -> Signer:
    """The user's first key (USER@HOST), made on first use; two processes making it at once get the same one."""
    name = _default_identity(suffix=False)
    try:
        signer = create_key(name, make_default=True)
    except UsageError:  # made meanwhile by another trtflow process
        signer = load_key(name)
        set_default(name)
    except OSError as exc:
        raise TrtflowError(f"cannot create a signing key in {keys_dir()}: {exc.strerror or exc}",
                           hint=f"set {ENV_KEY} (a CI secret) or XDG_CONFIG_HOME to a writable folder") from None
    return signer


def _default_identity(suffix: bool = True) -> str:
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "user"
    name = re.sub(r"[^A-Za-z0-9._+-]", "-", f"{user}@{socket.gethostname().split('.')[0]}")[:64]
    name = name if NAME.fullmatch(name) else "builder"
    if not suffix or not _exists(f"{name}.key"):
        return name
    return f"{name}-{os.urandom(3).hex()}"


# ----------------------------------------------------------------------------- trust files
@dataclass
class TrustFile:
    path: Path
    trusted: list[PublicKey] = field(default_factory=list)
    revoked: list[str] = field(default_factory=list)  # key ids (a revoked key may be named by id alone)
    revoked_names: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> TrustFile:
        """The file at ``path`` (empty when absent); a file that cannot be used is an error naming it."""
        import yaml

        try:
            text = _read_small(path)
        except FileNotFoundError:
            return cls(path)
        except Refused as exc:  # a link, a named pipe, a device (/dev/stdin), or too large: never waited on
            raise TrtflowError(f"cannot read the trust file {path}: {exc.why}",
                               hint=exc.hint or "make it a regular file (restore it from version control)") from None
        except OSError as exc:
            raise TrtflowError(f"cannot read the trust file {path}: {exc.strerror or exc}",
                               hint="fix its permissions") from None
        try:
            data = load_yaml(text, f"the trust file {path}") or {}
        except yaml.YAMLError as exc:
            raise TrtflowError(f"the trust file {path} is not valid YAML: {exc}".splitlines()[0],
                               hint="restore it from version control") from None
        except Refused as exc:
            raise TrtflowError(exc.message, hint="restore it from version control") from None
        if not isinstance(data, dict) or set(data) - {"trusted", "revoked"}:
            raise TrtflowError(f"the trust file {path} must be a mapping of `trusted:` and `revoked:` lists",
                               hint="write keys as `trtflow keys trust` does")
        out = cls(path)
        for entry in _entries(data, "trusted", path):
            out.trusted.append(PublicKey.parse(entry, f"{path}: trusted key"))
        for entry in _entries(data, "revoked", path):
            if re.fullmatch(r"[0-9a-f]{16}", entry):
                out.revoked.append(entry)
            else:
                key = PublicKey.parse(entry, f"{path}: revoked key")
                out.revoked.append(key.id)
                out.revoked_names[key.id] = key.name
        return out

    def write(self) -> None:
        import yaml

        body = {"trusted": [k.text for k in self.trusted], "revoked": list(dict.fromkeys(self.revoked))}
        text = ("# Public keys whose results trtflow reuses here (`trtflow keys trust`), and keys revoked for good\n"
                "# (`trtflow keys revoke`): a revoked key's results are never reused, whatever their dates.\n"
                + yaml.safe_dump(body, sort_keys=False, default_flow_style=False))
        write_file(self.path, text)  # a random temporary file made exclusively, renamed over it: no link followed


def _entries(data: dict[str, Any], name: str, path: Path) -> list[str]:
    value = data.get(name) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TrtflowError(f"the trust file {path}: `{name}:` must be a list of keys (NAME:BASE64) or key ids",
                           hint="write keys as `trtflow keys trust` does")
    return value


def project_file(project_root: Path) -> Path:
    return Path(project_root) / PROJECT_FILE


def user_file() -> Path:
    return config_dir() / USER_FILE


@dataclass(frozen=True)
class Policy:
    """Which keys' results may be reused: id -> public key; ``revoked``: ids never trusted."""

    trusted: dict[str, PublicKey]
    revoked: frozenset[str]
    names: dict[str, str]  # every key id we know a name for (trusted, revoked, own)
    files: tuple[Path, ...]  # what it was read from (a no-op run re-checks them)

    def verdict(self, signer_id: str, claimed: object = None) -> str | None:
        """Why results of ``signer_id`` are not reused (None: they are); ``claimed``: the name the result gives its
        signer (shown for a key we know no name of; never trusted)."""
        if signer_id in self.names:
            who = f"{signer_id} ({self.names[signer_id]})"
        elif isinstance(claimed, str) and NAME.fullmatch(claimed):
            who = f"{signer_id} (calling itself {claimed})"
        else:
            who = signer_id
        if signer_id in self.revoked:
            return f"signed by a revoked key: {who}"
        if signer_id not in self.trusted:
            return f"signed by a key this project does not trust: {who}"
        return None

    def describe(self, signer_id: str) -> str:
        return self.names.get(signer_id, "?")


def load_policy(project_root: Path | None) -> Policy:
    files = [user_file()] + ([project_file(project_root)] if project_root is not None else [])
    trusted: dict[str, PublicKey] = {}
    revoked: set[str] = set()
    names: dict[str, str] = {}
    for path in files:
        tf = TrustFile.read(path)
        for key in tf.trusted:
            trusted[key.id] = key
            names[key.id] = key.name
        revoked.update(tf.revoked)
        names.update(tf.revoked_names)
    own = own_public_keys()
    if _env_key() or os.environ.get(ENV_KEY_FILE):
        own.append(current_signer().public)
    for pub in own:
        trusted.setdefault(pub.id, pub)
        names.setdefault(pub.id, pub.name)
    for rid in revoked:
        trusted.pop(rid, None)
    return Policy(trusted, frozenset(revoked), names, (*files, public_dir()))


def policy_here() -> Policy:
    """The policy of the project the working folder is in (`trtflow verify`)."""
    from trtflow.fsutil import project_root

    return load_policy(project_root(os.getcwd()) or Path.cwd())
