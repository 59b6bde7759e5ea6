"""The recipe's history of measured figures: what a run records, the trend, the change points, the nightly check.

- `record`: turns a finished node's result into history rows (through its stage's ``figures``), recorded in the
  journal once per measurement;
- `changes`: change points of a series, found by Apache Otava's E-Divisive with a t-test (the ``history`` extra);
- `trend`: the series of a recipe file per node and figure, their change points, and `check`, which fails on a
  regression beyond a threshold among the latest runs (`trtflow history --check`).
"""
