"""Commands the built-in stages add to the trtflow CLI (``trtflow.commands`` entry points)."""
