#!/usr/bin/env python3
"""The versions last known to pass, so that drift is named, not guessed.

constraints/known-good.txt records every third-party package (name==version) of an environment in which the
checks passed (ruff, lint-imports, `python -m pytest -q -n 2`). CI installs as README does, the newest versions the
ranges in pyproject.toml allow; when a check fails, it prints how the installed packages differ from the record,
so a new release that broke us is named at once. Users install the record while a fix is made:
`pip install -c constraints/known-good.txt -e ".[all,dev]"`.

    python .ci/known_good.py write     # in an environment where the checks just passed: refresh the record
    python .ci/known_good.py diff      # the installed packages that differ from the record (name, record, installed)
    python .ci/known_good.py summary   # one line: how many differ

It reads the environment of the Python that runs it. trtflow itself, editable installs (the example plugin) and
pip are left out.
"""

from __future__ import annotations

import datetime
import json
import platform
import re
import sys
from importlib import metadata
from pathlib import Path

RECORD = Path(__file__).resolve().parent.parent / "constraints" / "known-good.txt"
LEFT_OUT = {"trtflow", "pip"}


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _editable(dist: metadata.Distribution) -> bool:
    try:
        info = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        return False
    return bool(info.get("dir_info", {}).get("editable"))


def installed() -> dict[str, str]:
    """name -> version of the packages this Python imports (the first of a name on sys.path wins)."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = _name(dist.metadata["Name"] or "")
        if name and name not in found and name not in LEFT_OUT and not _editable(dist):
            found[name] = dist.version
        elif name:
            found.setdefault(name, "")  # shadowed or left out: the first one decides
    return {name: version for name, version in found.items() if version}


def recorded(path: Path = RECORD) -> dict[str, str]:
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[_name(name)] = version.strip()
    return pins


def differences(record: dict[str, str], now: dict[str, str]) -> list[tuple[str, str, str]]:
    """(name, known-good version, installed version) for each package that differs; '-' where there is none."""
    return [(name, record.get(name, "-"), now.get(name, "-")) for name in sorted(record.keys() | now.keys())
            if record.get(name) != now.get(name)]


def write(path: Path = RECORD) -> None:
    now = installed()
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    header = (
        "# The versions last known to pass: ruff, lint-imports and `python -m pytest -q -n 2` were green with exactly\n"
        f"# these (Python {platform.python_version()}, {platform.system()} {platform.machine()}, {today}).\n"
        "# Install them while a newer release breaks trtflow:\n"
        "#     pip install -c constraints/known-good.txt -e \".[all,dev]\"\n"
        "# Refresh after a green run, in that environment:  python .ci/known_good.py write\n"
        "# (torch's +cpu build comes from the CPU wheel index or a local wheel, as README's torch note says.)\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + "".join(f"{name}=={version}\n" for name, version in sorted(now.items())),
                    encoding="utf-8")
    print(f"wrote {len(now)} versions to {path}")


def diff() -> int:
    rows = differences(recorded(), installed())
    where = RECORD.relative_to(RECORD.parent.parent)
    if not rows:
        print(f"The installed packages are exactly the known-good set ({where}): this is not drift.")
        return 0
    print(f"{len(rows)} installed packages differ from the versions last known to pass ({where}); the first of "
          f"them to check are the newer releases of direct dependencies. To use the known-good set meanwhile:\n"
          f"  pip install -c {where} -e \".[all,dev]\"")
    width = max(len(name) for name, _, _ in rows)
    print(f"  {'package':<{width}}  {'known-good':<14}  installed")
    for name, good, now in rows:
        print(f"  {name:<{width}}  {good:<14}  {now}")
    return len(rows)


def summary() -> None:
    rows = differences(recorded(), installed())
    newer = ", ".join(f"{name} {good} -> {now}" for name, good, now in rows[:8])
    print(f"known-good set: {len(rows)} installed packages differ" + (f" ({newer}{', ...' if len(rows) > 8 else ''})"
                                                                      if rows else ""))


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else ""
    if command == "write":
        write()
    elif command == "diff":
        diff()
    elif command == "summary":
        summary()
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
