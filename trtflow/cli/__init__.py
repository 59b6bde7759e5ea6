"""The `trtflow` command line: run, plan, status, show, report, history, schema, gc, verify, doctor."""
