"""What signed results cost: signing per result, verification per cache hit, beside a remote hit's time; and the
no-op run of this trtflow against another (e.g. the one before signing), timed in alternation.

Part 1, in one process, for results of one output of each --sizes MB (random bytes):
  - remote hit: `RemoteCache.pull` of the result from a directory remote into a fresh store (what a hit costs
    without signatures being checked; since signing it also computes the sha256 in the same read);
  - sha256 increment: the extra time of hashing the pulled bytes with xxh3 and sha256 in one read over xxh3 alone
    (what checking the signed sha256 adds to a pull: once per object, then the stat cache answers);
  - verification per hit: `signing.trust_problem` with the bytes' sha256 cached (the signature: canonical JSON and
    one ed25519 verification against the trust policy), the stat cache as a run has it after the pull;
  - signing per result: `signing.sign` of the committed manifest (its sha256 is computed in the commit's read).
Each is timed --repeat times; medians with min-max.

Part 2 (--before PYTHON): the no-op `trtflow run` of a synthetic recipe of --nodes nodes, timed in alternating
rounds with this interpreter's trtflow and with PYTHON's (e.g. /work/main/.venv/bin/python), each on its own store.

    python bench/signing_cost.py --sizes 1 50 --repeat 7 --before /work/main/.venv/bin/python --rounds 5
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class DictCache:
    def __init__(self) -> None:
        self.entries: dict[str, tuple[tuple[int, ...], str]] = {}

    def get(self, path: str, sig: tuple[int, ...]) -> str | None:
        hit = self.entries.get(path)
        return hit[1] if hit is not None and hit[0] == sig else None

    def put(self, path: str, sig: tuple[int, ...], digest: str) -> None:
        self.entries[path] = (sig, digest)


def spread(times: list[float], unit: float = 1e3, name: str = "ms") -> str:
    return (f"median {statistics.median(times) * unit:.3f} {name} (min {min(times) * unit:.3f}, max "
            f"{max(times) * unit:.3f}, n={len(times)})")


def part1(sizes: list[int], repeat: int, work: Path) -> None:
    from trtflow.fingerprint import stream_digests
    from trtflow.storage import signing
    from trtflow.storage.remote import RemoteCache
    from trtflow.storage.store import Store

    os.environ["XDG_CONFIG_HOME"] = str(work / "config")
    project = work / "project"
    project.mkdir()
    for size in sizes:
        producer = Store(work / f"producer-{size}")
        producer.ensure()
        out = work / f"out-{size}"
        out.mkdir()
        (out / "model.engine").write_bytes(os.urandom(size * 2**20))
        key = hashlib.sha256(f"bench{size}".encode()).hexdigest()[:32]
        manifest = producer.commit(key, {"stage": "build", "node": "engine", "recipe_id": "bench.yaml",
                                         "summary": {"latency_ms": 1.0}},
                                   out, {"engine": ("model.engine", "engine")})
        remote = RemoteCache(str(work / f"remote-{size}"))
        (work / f"remote-{size}").mkdir()
        remote.push(key, producer)
        pulls, increments, verifies, signs = [], [], [], []
        for i in range(repeat):
            consumer = Store(work / f"consumer-{size}-{i}")
            consumer.ensure()
            cache = DictCache()
            there = remote.get_manifest(key)
            start = time.perf_counter()
            remote.pull(there, consumer, cache)
            pulls.append(time.perf_counter() - start)
            obj = consumer.object_path(manifest["outputs"]["engine"]["digest"])
            with open(obj, "rb") as f:
                start = time.perf_counter()
                stream_digests(f, False)
                fast = time.perf_counter() - start
            with open(obj, "rb") as f:
                start = time.perf_counter()
                stream_digests(f, True)
                increments.append(time.perf_counter() - start - fast)
            kctx = SimpleNamespace(project_root=project, memo={}, stat_cache=cache, evidence=None)
            signing.trust_problem(consumer, there, kctx)  # reads the trust policy once per plan, not per hit
            start = time.perf_counter()
            problem = signing.trust_problem(consumer, there, kctx)
            verifies.append(time.perf_counter() - start)
            assert problem is None, problem
            start = time.perf_counter()
            signing.sign(manifest)
            signs.append(time.perf_counter() - start)
        hit = statistics.median(pulls)
        print(f"{size} MB result, directory remote:")
        print(f"  remote hit (pull)           {spread(pulls)}")
        print(f"  sha256 increment per pull   {spread(increments)}  = "
              f"{100 * statistics.median(increments) / hit:.1f}% of the hit")
        print(f"  verification per hit        {spread(verifies)}  = "
              f"{100 * statistics.median(verifies) / hit:.2f}% of the hit")
        print(f"  signing per result          {spread(signs)}  = {100 * statistics.median(signs) / hit:.2f}% of "
              "the hit")


def part2(before: str, nodes: int, rounds: int, work: Path) -> None:
    from bench.noop_overhead import child_env, with_example_plugin, write_trtflow_recipe

    env = with_example_plugin(child_env(), work)
    env["XDG_CONFIG_HOME"] = str(work / "config")
    commands = {}
    for label, python in (("this trtflow", sys.executable), ("before", before)):
        folder = work / label.replace(" ", "-")
        folder.mkdir()
        recipe = write_trtflow_recipe(folder, nodes)
        cmd = [python, "-m", "trtflow.cli", "run", "-q", str(recipe), "--store", str(folder / "store")]
        for _ in range(2):  # the cold run, then the first no-op run, which leaves the no-op record
            proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"{label}: {proc.stdout}{proc.stderr}")
        commands[label] = (cmd, folder)
    planning = dict(env, TRTFLOW_NO_SHORTCUT="1")  # the no-op run that plans (every result's signature checked)
    for mode, mode_env in (("no-op run (shortcut)", env), ("no-op run, planned (TRTFLOW_NO_SHORTCUT=1)", planning)):
        times: dict[str, list[float]] = {k: [] for k in commands}
        cpu: dict[str, list[float]] = {k: [] for k in commands}  # user + system: what a busy host distorts least
        for _ in range(rounds):
            for label, (cmd, folder) in commands.items():
                before_cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
                start = time.perf_counter()
                subprocess.run(cmd, cwd=folder, env=mode_env, capture_output=True, check=True)
                times[label].append(time.perf_counter() - start)
                after_cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu[label].append(after_cpu.ru_utime + after_cpu.ru_stime - before_cpu.ru_utime - before_cpu.ru_stime)
        print(f"{mode} of {nodes} nodes, {rounds} alternating rounds:")
        for what, table in (("wall", times), ("cpu", cpu)):
            for label, series in table.items():
                print(f"  {what} {label:13s} {spread(series, 1.0, 's')}")
            ratios = [a / b for a, b in zip(table["this trtflow"], table["before"], strict=True)]
            print(f"  {what} ratio this/before: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max "
                  f"{max(ratios):.3f}, n={len(ratios)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 50], help="output sizes in MB")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--before", help="the python of another trtflow install, for the no-op comparison")
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trtflow-signing-bench-") as tmp:
        (Path(tmp) / "p1").mkdir()
        (Path(tmp) / "p2").mkdir()
        if args.sizes != [0]:  # --sizes 0: only the no-op comparison
            part1(args.sizes, args.repeat, Path(tmp) / "p1")
        if args.before:
            part2(args.before, args.nodes, args.rounds, Path(tmp) / "p2")


if __name__ == "__main__":
    main()
