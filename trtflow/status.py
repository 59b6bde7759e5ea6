"""What the planner says of a node: up to date, to run, or not runnable here (one definition, imported by the
planner, the runner and the reports; it imports nothing, so the no-op shortcut can use it cheaply)."""

FRESH = "fresh"
STALE = "stale"
SKIP = "skipped"
