"""What the store's file operations cost, per call, in this process: reading a manifest, checking an object against
the stat cache, writing a manifest, and copying a node's outputs to build/ (what planning and a no-op run do per
node). For the confined layer (issue 24: every path walked from a folder opened once, without following links),
run it for two installs and compare, e.g. the checkout before the change on PYTHONPATH:

    python bench/store_ops.py --nodes 2000 --repeat 7
    PYTHONPATH=/path/to/old/checkout python bench/store_ops.py --nodes 2000 --repeat 7

Each figure is the median over --repeat passes of the per-call time (microseconds), with the spread (min-max).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path


class _Cache:
    """An in-memory stat cache (the journal's protocol), so that the figure is the store's own work."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[int, int, int, str]] = {}

    def get(self, path: str, size: int, mtime_ns: int, inode: int) -> str | None:
        row = self.rows.get(path)
        return row[3] if row and row[:3] == (size, mtime_ns, inode) else None

    def put(self, path: str, size: int, mtime_ns: int, inode: int, digest: str) -> None:
        self.rows[path] = (size, mtime_ns, inode, digest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    import trtflow
    from trtflow.fingerprint import hash_text
    from trtflow.storage.store import Store

    root = Path(tempfile.mkdtemp(prefix="trtflow-store-ops-"))
    try:
        store = Store(root / "store")
        store.ensure()
        cache = _Cache()
        manifests = []
        for i in range(args.nodes):
            out = root / "scratch" / str(i)
            out.mkdir(parents=True)
            (out / "data.bin").write_bytes(f"node {i}".encode() * 64)
            key = hash_text(f"key {i}")
            manifests.append(store.commit(key, {"node": f"n{i}"}, out, {"data": ("data.bin", "blob")}, cache))
        time.sleep(2.1)  # past the stat cache's racy window: objects are trusted by their signature
        for m in manifests:
            out = m["outputs"]["data"]
            store.object_intact(out["digest"], out["size"], cache)

        def read() -> None:
            for m in manifests:
                store.read_manifest(m["key"])

        def intact() -> None:
            for m in manifests:
                out = m["outputs"]["data"]
                store.object_intact(out["digest"], out["size"], cache)

        def write() -> None:
            for m in manifests:
                store.write_manifest(m["key"], m)

        def materialize() -> None:
            for m in manifests[: max(1, args.nodes // 10)]:
                store.materialize(m, root / "build" / "r" / m["node"])

        print(f"trtflow from {Path(trtflow.__file__).parent}; {args.nodes} nodes, {args.repeat} passes; "
              "microseconds per call: median (min-max)")
        for name, work, calls in (("read_manifest", read, args.nodes), ("object_intact (cached)", intact, args.nodes),
                                  ("write_manifest (fsync)", write, args.nodes),
                                  ("materialize (re-run, copies kept)", materialize, max(1, args.nodes // 10))):
            times = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                work()
                times.append((time.perf_counter() - start) / calls * 1e6)
            print(f"  {name:36s} {statistics.median(times):8.1f} ({min(times):.1f}-{max(times):.1f})")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
