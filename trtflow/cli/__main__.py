"""`python -m trtflow.cli`: the `trtflow` console script."""

from trtflow.cli.main import main

main()
