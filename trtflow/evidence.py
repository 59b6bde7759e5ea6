"""What a plan's decisions rested on, as the planner observed it while deciding.

Collected only when asked (`plan.make_plan(..., evidence=...)`): the no-op shortcut of `trtflow run`
(`execution.noop`) turns it into its record and later replays each item with the function that produced it, so
the shortcut is derived from the planner's work instead of being a second judge of "up to date". Every path is
kept as the recipe spells it, never only as it resolved: a link retargeted, ``~`` under another ``HOME``, a
``$VAR`` with another value resolve elsewhere when replayed.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Evidence:
    # a path as a recipe spells it, relative to the recipe's folder -> the path it resolved to
    paths: dict[str, str] = field(default_factory=dict)
    # a python: module reference's module name -> the file it was found at
    modules: dict[str, str] = field(default_factory=dict)
    # a file or folder the planner hashed (data, python: files, the modules their code imports) -> its digest
    files: dict[str, str] = field(default_factory=dict)
    # module slots ("<folder>/<name>") that were empty when a fresh result's code ran, and must stay empty
    absent: set[str] = field(default_factory=set)
    # files the code read that were gone when its run ended (and are still gone): they must stay gone
    missing: set[str] = field(default_factory=set)
    # (pre-key, module set) by which the planner found each fresh result of python: code in the journal's index
    dep_sets: list[tuple[str, tuple[tuple[str, ...], tuple[str, ...]]]] = field(default_factory=list)
    # environment facts the keys were made with (a host's; GPU nodes are never replayed) -> value
    facts: dict[str, str] = field(default_factory=dict)
