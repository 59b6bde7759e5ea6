"""Built-in trtflow stages, installed as trtflow_stages and found through entry points."""
