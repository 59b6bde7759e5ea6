"""trtflow's own settings (``TRTFLOW_*`` variables): which processes see which. Deny by default.

A setting is for the process it configures. The CI's private key (``TRTFLOW_SIGNING_KEY``, or the file
``TRTFLOW_SIGNING_KEY_FILE`` names: `SIGNING_KEY_VARIABLES`) is read by `trtflow.keys` in the process that signs
and nowhere else: no node sees it, and a recipe cannot spell it (``${TRTFLOW_SIGNING_KEY}`` in a recipe, ``$VAR``
in a path: `recipe.load.interpolate`, `fsutil.resolve_user_path` refuse them). A node's processes see only the
settings of `NODE_SETTINGS`, each listed for the reason written beside it; every other ``TRTFLOW_*`` variable (the
store, the remote cache and its namespace, gc's and the shortcut's settings, one of a later release, a typo) is
withheld. Every process a node runs in starts with `node_environment` (the fork server and a worker started without
it: `execution.forkserver`, `execution.local`), and the node's ``python:`` code sees the listed settings and the
variables `depfile.code_environment` names, nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

PREFIX = "TRTFLOW_"
SIGNING_KEY, SIGNING_KEY_FILE = "TRTFLOW_SIGNING_KEY", "TRTFLOW_SIGNING_KEY_FILE"
SIGNING_KEY_VARIABLES = frozenset({SIGNING_KEY, SIGNING_KEY_FILE})
#: the settings a node's processes read; every other TRTFLOW_* variable is withheld from them
NODE_SETTINGS = frozenset({
    "TRTFLOW_PASS_ENV",  # which variables the node's python: code sees (read by the worker: depfile)
    "TRTFLOW_ALLOWED_PATHS",  # where project files may be, besides the project (fsutil.allowed_roots_for)
    "TRTFLOW_NO_CONFINEMENT",  # foreign code runs unconfined where no sandbox can be made (stages.formats)
    "TRTFLOW_SANDBOX",  # how the sandbox of foreign code is made (stages.formats.confinement)
    "TRTFLOW_TEST_CRASH_OPTIMIZER",  # the test suite's crash of the optimiser (stages.accuracy.recovery)
})


def node_setting(name: str) -> bool:
    """Whether a node's processes see the variable ``name``: any variable not trtflow's, and trtflow's listed."""
    return not name.startswith(PREFIX) or name in NODE_SETTINGS


def node_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a node's process starts with: ``environ`` (this process's) less trtflow's settings that
    are not `NODE_SETTINGS` (the signing key among them)."""
    environ = os.environ if environ is None else environ
    return {name: value for name, value in environ.items() if node_setting(name)}


def refused_in_recipe(name: str) -> str | None:
    """Why a recipe may not read the variable ``name`` (``${NAME}``, ``$NAME`` in a path), or None: it may."""
    if name in SIGNING_KEY_VARIABLES:
        return (f"environment variable {name!r} gives trtflow its signing key, which a recipe cannot read "
                "(a recipe's values are recorded in the store and reach the nodes)")
    return None
