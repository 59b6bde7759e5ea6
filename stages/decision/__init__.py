"""The select stage's decision, as pure functions."""
