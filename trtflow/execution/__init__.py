"""Execution: schedule ready nodes by resources, run them through an executor, commit their results."""
