"""Reliability tests: crashes, interruption, concurrency, bad input and untrusted files."""
