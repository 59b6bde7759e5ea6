"""`trtflow keys`: create, show and list signing keys; trust and revoke public keys; adopt unsigned results.

Registered as the ``keys`` command (entry point ``trtflow.commands``). Keys and trust files: `trtflow.keys`;
what a signature covers and how reuse checks it: `trtflow.storage.signing`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from trtflow import keys
from trtflow.errors import StoreError, UsageError

app = typer.Typer(help="Signing keys: who built a result, and whose results this project reuses.",
                  no_args_is_help=True, rich_markup_mode=None)

ProjectOpt = Annotated[Path | None, typer.Option(
    "--project", help="The project whose trtflow-trust.yaml is edited (default: the git or pyproject root above "
    "the working folder).")]
UserOpt = Annotated[bool, typer.Option(
    "--user", help="Edit your own trust file ($XDG_CONFIG_HOME/trtflow/trust.yaml: every project) instead of the "
    "project's.")]


def _project(project: Path | None) -> Path:
    from trtflow.fsutil import project_root

    if project is not None:
        return project.absolute()
    return project_root(os.getcwd()) or Path.cwd()  # as keys.policy_here


def _trust_file(project: Path | None, user: bool) -> keys.TrustFile:
    return keys.TrustFile.read(keys.user_file() if user else keys.project_file(_project(project)))


@app.command()
def create(
    name: Annotated[str | None, typer.Argument(help="A name for the key, e.g. alice@laptop or ci-main "
                                                    "(default: USER@HOST).")] = None,
    default: Annotated[bool, typer.Option("--default", help="Sign with it from now on (the first key is the "
                                                            "default anyway).")] = False,
) -> None:
    """Create a signing key in your key store (a 0600 file); print its public key to trust it."""
    signer = keys.create_key(name or keys._default_identity(), make_default=True if default else None)
    pub = signer.public
    print(f"created key {pub.name} (id {pub.id}) in {signer.source}")
    print(f"public key: {pub.text}")
    print("trust it in this project: trtflow keys trust  (then commit trtflow-trust.yaml)")


@app.command()
def show(
    name: Annotated[str | None, typer.Argument(help="One of your keys (default: the one results are signed "
                                                    "with).")] = None,
    secret: Annotated[bool, typer.Option("--secret", help="Print the private key (NAME:BASE64) to store as a CI "
                                                          "secret (TRTFLOW_SIGNING_KEY).")] = False,
    pem: Annotated[bool, typer.Option("--pem", help="Print the public key as PEM, for openssl (checking provenance "
                                                    "without trtflow).")] = False,
) -> None:
    """Print a public key (NAME:BASE64) as trust files hold it; --secret: its private key, for a CI secret store."""
    signer = keys.load_key(name) if name else keys.current_signer()
    if pem:
        from cryptography.hazmat.primitives import serialization

        print(signer.private.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo).decode(),
              end="")
        return
    print(signer.secret_text if secret else signer.public.text)


@app.command("list")
def list_keys(project: ProjectOpt = None) -> None:
    """Your keys, and the keys this project and you trust or have revoked."""
    signing = keys.current_signer()
    print("your keys:")
    for signer in keys.own_keys() or []:
        pub = signer.public
        mark = "  (signs results)" if pub.id == signing.public.id else ""
        print(f"  {pub.id}  {pub.name}{mark}")
    if signing.source in (keys.ENV_KEY, os.environ.get(keys.ENV_KEY_FILE)):
        print(f"  {signing.public.id}  {signing.public.name}  (signs results; from {signing.source})")
    for label, path in (("project", keys.project_file(_project(project))), ("user", keys.user_file())):
        tf = keys.TrustFile.read(path)
        print(f"{label} trust file {path}:" + ("" if path.exists() else " (none)"))
        for key in tf.trusted:
            print(f"  trusted  {key.id}  {key.name}")
        for rid in tf.revoked:
            print(f"  revoked  {rid}  {tf.revoked_names.get(rid, '')}".rstrip())


@app.command()
def trust(
    key: Annotated[str | None, typer.Argument(help="A public key (NAME:BASE64, as `trtflow keys show` prints it), "
                                                   "or the name of one of your keys (default: the one you sign "
                                                   "with).")] = None,
    project: ProjectOpt = None,
    user: UserOpt = False,
) -> None:
    """Trust a key: this project (or you, --user) reuses the results it signed."""
    if key is None:
        pub = keys.current_signer().public
    elif ":" in key:
        pub = keys.PublicKey.parse(key)
    else:
        pub = keys.load_key(key).public
    tf = _trust_file(project, user)
    if pub.id in tf.revoked:
        raise UsageError(f"key {pub.id} ({pub.name}) is revoked in {tf.path}",
                         hint="a revoked key is revoked for good: create a new key and trust that one")
    if all(k.id != pub.id for k in tf.trusted):
        tf.trusted.append(pub)
        tf.write()
    print(f"trusted {pub.id} ({pub.name}) in {tf.path}" + ("" if user else "; commit it to share the trust"))


@app.command()
def revoke(
    key: Annotated[str, typer.Argument(help="A key id (16 hex digits), a public key (NAME:BASE64) or the name of a "
                                            "trusted key.")],
    project: ProjectOpt = None,
    user: UserOpt = False,
) -> None:
    """Revoke a key for good: no result it signed is reused, whatever its date (rotate: create and trust a new key
    first; results of keys still trusted are kept)."""
    tf = _trust_file(project, user)
    if ":" in key:
        pub = keys.PublicKey.parse(key)
        rid, name = pub.id, pub.name
    else:
        match = [k for k in tf.trusted if key in (k.id, k.name)]
        if len(key) == 16 and all(c in "0123456789abcdef" for c in key):
            rid, name = key, match[0].name if match else ""
        elif len(match) == 1:
            rid, name = match[0].id, match[0].name
        else:
            raise UsageError(f"no single trusted key is named {key!r} in {tf.path}",
                             hint="give its id (`trtflow keys list`) or its public key")
    tf.trusted = [k for k in tf.trusted if k.id != rid]
    if rid not in tf.revoked:
        tf.revoked.append(rid)
    tf.write()
    print(f"revoked {rid} {name} in {tf.path}".replace("  ", " ") + ("" if user else "; commit it"))


@app.command()
def adopt(
    store: Annotated[Path | None, typer.Option("--store", help="The store (default: TRTFLOW_STORE, or .trtflow "
                                                               "here).")] = None,
    wait: Annotated[float, typer.Option("--wait", help="Seconds to wait for runs holding the store.")] = 60.0,
) -> None:
    """Sign the unsigned results of an older trtflow in your store with your key (their bytes are checked first):
    say so only for results you built. Results signed by anyone are left as they are."""
    from trtflow.pipeline import default_store
    from trtflow.storage.lock import EXCLUSIVE, StoreLock
    from trtflow.storage.manifest import manifest_problem
    from trtflow.storage.signing import is_signed, sign_stored

    st = default_store(store)
    if not st.exists():
        print(f"no store at {st.root}")
        return
    signer = keys.current_signer()
    signed = skipped = 0
    with StoreLock(st.tree).held(EXCLUSIVE, "trtflow keys adopt", wait, None):
        for path, manifest in st.iter_manifests():
            key = path.stem
            if not isinstance(manifest, dict) or is_signed(manifest) or manifest_problem(key, manifest):
                continue
            if not st.intact(manifest):
                skipped += 1
                continue
            try:
                st.write_manifest(key, sign_stored(st, key, manifest, signer))
            except (OSError, ValueError) as exc:
                raise StoreError(f"could not sign {path}: {exc}", hint="`trtflow verify --fix` repairs the store") \
                    from None
            signed += 1
    print(f"signed {signed} unsigned results with {signer.public.id} ({signer.public.name})"
          + (f"; {skipped} with missing or damaged outputs left unsigned (rebuilt when used)" if skipped else ""))
