"""What every node of a run shares: set up once by the runner, then only read (by the run's and the nodes' threads).

Nothing here changes during a run, except through objects that guard themselves: the journal (its lock), the
notes and the remote tally (their locks), the observers (each guards its own state), the executor (its lock), the
cancel event, and the key context's memo, whose entries are computed from files alone (two threads computing one
entry store equal values; no thread iterates it).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from trtflow.execution.observers import RunObserver
from trtflow.execution.protocol import Executor
from trtflow.execution.results import Notes, RemoteTally, RunOptions
from trtflow.graph import Graph
from trtflow.node_keys import KeyContext
from trtflow.storage.confined.folders import RunFolders
from trtflow.storage.journal import Journal
from trtflow.storage.refs import RecipeIdentity
from trtflow.storage.store import Store


@dataclass(frozen=True)
class RunContext:
    graph: Graph
    store: Store
    recipe: RecipeIdentity
    run_id: str
    options: RunOptions
    kctx: KeyContext
    journal: Journal  # also the store's stat cache
    executor: Executor
    observers: RunObserver
    notes: Notes
    cancel: threading.Event
    cache: Any = None  # the remote cache (RemoteCache) results are pulled from and pushed to; None: none
    transfer: Any = None  # where the executor's workers fetch inputs and leave outputs (RemoteCache); None: local
    folders: RunFolders | None = None  # tmp/<run>, logs/<run> and the nodes' folders, held (None: made by hand)
    refs_at_start: dict[str, str] = field(default_factory=dict)  # what the previous runs used: "previous" results
    remote_tally: RemoteTally = field(default_factory=RemoteTally)  # what the run pulled, pushed and refused there
