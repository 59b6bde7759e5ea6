"""Judging a benchmark: pinned baselines, the gates as typed verdicts, the reference measured beside the candidate,
the figures kept for the history."""
