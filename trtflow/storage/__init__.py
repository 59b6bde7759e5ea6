"""Storage: the content-addressed store, the journal, the remote cache and store maintenance."""
