"""Drive trtflow from Python: plan, run, and read each node's metrics.

    python examples/python_api.py pipelines/quickstart.yaml
"""

from __future__ import annotations

import sys

from trtflow import api


def main(recipe: str) -> int:
    for step in api.plan(recipe):
        print(f"{step.node.name:12} {step.status:6} {step.reason}")
    _, _, summary = api.run(recipe)
    for name, result in summary.results.items():
        print(f"{name:12} {result.status:8} {', '.join(str(p) for p in result.outputs.values())}")
    validate = summary.results.get("validate")
    if validate is not None:
        print("validate summary keys:", sorted(validate.summary))
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "pipelines/quickstart.yaml"))
