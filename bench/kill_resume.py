"""Fault injection: kill `trtflow run` at random points, resume it, and check nothing was lost or redone.

For each trial a fresh store runs a multi-node pipeline of cheap deterministic `synth` nodes; the run is
killed (SIGKILL, or SIGINT as Ctrl-C sends it) at a random point chosen by observed progress, never by elapsed
time (so the points land where they should on a busy machine too): at start-up, once the run is recorded, right
after the k-th node is committed, or while a node is inside its stage after k commits. Then it runs again to
completion. A trial passes when:
  - the materialised outputs (build/<recipe>/<node>/data.bin) are byte-identical to an uninterrupted run;
  - no node whose manifest was committed before the kill ran again (its manifest is untouched and the
    resumed run reports it fresh), and no node was built ("done") twice across both runs;
  - `trtflow verify` finds the store clean and no scratch directory is left behind;
  - SIGINT makes `trtflow run` exit with 130 and record the run as interrupted.

    python bench/kill_resume.py --count 200             # prints "200/200 resumed identical"
    python bench/kill_resume.py --count 50 --signal int

The pytest suite runs the same harness with a smaller count (tests/reliability/test_kill_resume.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE_NAME = "killme"

# 7 nodes: two sources, chains of depth 4, parallel branches; sleeps make kills land inside stages too.
PIPELINE = f"""\
name: {RECIPE_NAME}
nodes:
  - {{name: src_a, stage: synth, params: {{text: a, size: 200000, sleep: 0.15}}}}
  - {{name: src_b, stage: synth, params: {{text: b, size: 50000, sleep: 0.05}}}}
  - {{name: mid_a, stage: synth, params: {{text: ma, size: 100000, sleep: 0.1}}, inputs: {{source: src_a}}}}
  - {{name: mid_b, stage: synth, params: {{text: mb, size: 30000, sleep: 0.2}}, inputs: {{source: src_b}}}}
  - {{name: side, stage: synth, params: {{text: s, size: 1000, sleep: 0.05}}, inputs: {{source: src_a}}}}
  - {{name: deep, stage: synth, params: {{text: d, size: 70000, sleep: 0.1}}, inputs: {{source: mid_a}}}}
  - {{name: final, stage: synth, params: {{text: f, size: 5000, sleep: 0.05}}, inputs: {{source: deep}}}}
"""
NODES = ["src_a", "src_b", "mid_a", "mid_b", "side", "deep", "final"]


def trtflow_command() -> list[str]:
    script = Path(sys.executable).with_name("trtflow")
    return [str(script)] if script.exists() else [sys.executable, "-m", "trtflow.cli"]


def plugin_environment(workdir: Path) -> dict[str, str]:
    """Environment in which `trtflow` finds the example `synth` stage (installed or not)."""
    sys.path.insert(0, str(REPO))
    from tests.reliability.plugins import subprocess_env, write_plugin_distribution

    return subprocess_env(write_plugin_distribution(workdir / "plugins"))


#: Kill points: "startup", "recorded", "commit:K" (right after K manifests), "stage:K" (a node inside its
#: stage after K commits).
POINTS = ["startup", "recorded", *(f"commit:{k}" for k in range(1, len(NODES))),
          *(f"stage:{k}" for k in range(len(NODES)))]


@dataclass
class Trial:
    index: int
    signal: str
    point: str
    interrupted: bool = False  # the signal arrived before the run finished
    during_startup: bool = False  # ... and before the run was recorded (Python still starting)
    exit_code: int | None = None
    committed_before: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


class Harness:
    def __init__(self, workdir: Path, env: dict[str, str], jobs: int = 2, verify_cli: bool = True,
                 cli_verifications: int | None = None) -> None:
        self.workdir = workdir
        self.env = env
        self.jobs = jobs
        self.verify_cli = verify_cli
        #: with verify_cli, how many trials check their store through `trtflow verify` (None: all); the others
        #: through `verify_store` in this process, the check the command makes, without a process start each
        self.cli_verifications = cli_verifications
        self.recipe = workdir / "killme.yaml"
        self.recipe.write_text(PIPELINE, encoding="utf-8")
        self.reference: dict[str, bytes] = {}
        self.reference_seconds = 0.0

    # ----------------------------------------------------------------- helpers
    def _run_args(self, trial_dir: Path) -> list[str]:
        return [*trtflow_command(), "run", str(self.recipe), "--store", str(trial_dir / "store"),
                "-j", str(self.jobs), "--quiet"]

    def _outputs(self, trial_dir: Path) -> dict[str, bytes]:
        out = {}
        for node in NODES:
            path = trial_dir / "build" / RECIPE_NAME / node / "data.bin"
            out[node] = path.read_bytes() if path.exists() else b""
        return out

    @staticmethod
    def _manifests(store: Path) -> dict[str, tuple[str, int, int]]:
        """node -> (run_id that built it, manifest inode, manifest mtime_ns)."""
        found = {}
        for path in sorted((store / "nodes").glob("*/*.json")):
            data = json.loads(path.read_text(encoding="utf-8"))
            st = path.stat()
            found[data["node"]] = (data["run_id"], st.st_ino, st.st_mtime_ns)
        return found

    @staticmethod
    def _journal(store: Path) -> tuple[list[tuple[str, str, str]], dict[str, str]]:
        """(node runs, {run id: status} in start order); empty while no run has been recorded yet."""
        if not (store / "trtflow.db").exists():
            return [], {}
        conn = sqlite3.connect(str(store / "trtflow.db"))
        try:
            rows = conn.execute("SELECT run_id, node, status FROM node_runs").fetchall()
            runs = dict(conn.execute("SELECT id, status FROM runs ORDER BY started").fetchall())
        except sqlite3.OperationalError:  # the journal's tables were not created yet
            return [], {}
        finally:
            conn.close()
        return rows, runs

    def _verify(self, store: Path) -> list[str]:
        if self.verify_cli and (self.cli_verifications is None or self.cli_verifications > 0):
            if self.cli_verifications is not None:
                self.cli_verifications -= 1
            proc = subprocess.run([*trtflow_command(), "verify", "--store", str(store)], env=self.env,
                                  capture_output=True, text=True, cwd=self.workdir)
            if proc.returncode != 0 or "clean" not in proc.stdout:
                return [f"trtflow verify: rc {proc.returncode}: {proc.stdout.strip()} {proc.stderr.strip()}"]
            return []
        from trtflow.storage.store import Store
        from trtflow.storage.verify import verify_store

        return list(verify_store(Store(store)).problems)

    # ----------------------------------------------------------------- reference
    def make_reference(self) -> None:
        ref_dir = self.workdir / "reference"
        ref_dir.mkdir()
        started = time.perf_counter()
        proc = subprocess.run(self._run_args(ref_dir), cwd=ref_dir, env=self.env, capture_output=True, text=True)
        self.reference_seconds = time.perf_counter() - started
        if proc.returncode != 0:
            raise RuntimeError(f"the reference run failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        self.reference = self._outputs(ref_dir)
        missing = [n for n, data in self.reference.items() if not data]
        if missing:
            raise RuntimeError(f"the reference run produced no output for {missing}")
        shutil.rmtree(ref_dir)

    # ----------------------------------------------------------------- kill points
    @staticmethod
    def _committed(store: Path) -> int:
        return len(list((store / "nodes").glob("*/*.json"))) if (store / "nodes").exists() else 0

    @staticmethod
    def _recorded(store: Path) -> bool:
        return bool(Harness._journal(store)[1])

    @staticmethod
    def _inside_a_stage(store: Path) -> bool:
        for log in (store / "logs").glob("*/*.log") if (store / "logs").exists() else []:
            try:
                if "starting; params" in log.read_text(errors="replace"):
                    return True
            except OSError:
                continue
        return False

    def _reached(self, point: str, store: Path, committed_at_start: int) -> bool:
        if point == "startup":
            return True
        if point == "recorded":
            return self._recorded(store)
        kind, _, count = point.partition(":")
        commits = self._committed(store) - committed_at_start
        if kind == "commit":
            return commits >= int(count)
        return commits >= int(count) and self._inside_a_stage(store) and self._committed(store) < len(NODES)

    def _wait_for(self, point: str, store: Path, proc: subprocess.Popen) -> None:
        """Poll until the run reaches ``point`` (or ends): progress is observed, never timed."""
        while proc.poll() is None and not self._reached(point, store, 0):
            time.sleep(0.002)

    # ----------------------------------------------------------------- one trial
    def trial(self, index: int, sig: str, point: str) -> Trial:
        result = Trial(index, sig, point)
        trial_dir = self.workdir / f"trial-{index:04d}"
        trial_dir.mkdir()
        store = trial_dir / "store"
        proc = subprocess.Popen(self._run_args(trial_dir), cwd=trial_dir, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._wait_for(point, store, proc)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL if sig == "kill" else signal.SIGINT)
            result.interrupted = True
        try:
            output, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
            result.problems.append("trtflow run did not exit within 60 s of the signal")
        result.exit_code = proc.returncode
        _, runs = self._journal(store)
        result.during_startup = result.interrupted and not runs
        if sig == "int" and result.interrupted:
            if result.during_startup:
                # Ctrl-C while Python itself is still importing, before trtflow's code runs: Python's own
                # handling applies (exit by SIGINT, which shells report as 130, or a failed import).
                if proc.returncode not in (130, -signal.SIGINT) and "KeyboardInterrupt" not in output:
                    result.problems.append(f"SIGINT during start-up: exit code {proc.returncode}: {output[-800:]}")
            elif proc.returncode == 130:
                if list(runs.values())[-1] not in ("interrupted", "ok"):  # "ok": it had just finished
                    result.problems.append(f"SIGINT: the run was not recorded as interrupted: {runs}")
            elif proc.returncode == -signal.SIGINT:
                # Only while Python shuts down after the work and its summary are done (shells show 130).
                if not re.search(r"^(Done|Failed|Nothing to do|interrupted)", output, re.M):
                    result.problems.append(f"SIGINT: killed by the signal before finishing: {output[-800:]}")
            elif proc.returncode != 0:
                result.problems.append(f"SIGINT: expected exit code 130, got {proc.returncode}: {output[-800:]}")
        if sig == "kill" and result.interrupted and proc.returncode not in (-signal.SIGKILL, 0):
            result.problems.append(f"SIGKILL: unexpected exit code {proc.returncode}")
        before = self._manifests(store) if store.exists() else {}
        result.committed_before = sorted(before)

        resume = subprocess.run(self._run_args(trial_dir), cwd=trial_dir, env=self.env, capture_output=True,
                                text=True, timeout=120)
        if resume.returncode != 0:
            result.problems.append(f"resume failed (rc {resume.returncode}): {resume.stdout[-800:]} "
                                   f"{resume.stderr[-800:]}")
            return result
        after = self._manifests(store)
        for node, built in before.items():
            if after.get(node) != built:
                result.problems.append(f"{node} was committed before the kill but its manifest was rewritten")
        rows, runs = self._journal(store)
        resume_run = list(runs)[-1]  # ordered by start time
        if runs[resume_run] != "ok" or "running" in runs.values():
            result.problems.append(f"runs not closed properly: {runs}")
        for run_id, node, status in rows:
            if run_id == resume_run and node in before and status == "done":
                result.problems.append(f"{node} had finished before the kill but ran again")
        done_counts: dict[str, int] = {}
        for _, node, status in rows:
            if status == "done":
                done_counts[node] = done_counts.get(node, 0) + 1
        twice = sorted(n for n, c in done_counts.items() if c > 1)
        if twice:
            result.problems.append(f"built twice: {twice}")
        outputs = self._outputs(trial_dir)
        differ = sorted(n for n in NODES if outputs[n] != self.reference[n])
        if differ:
            result.problems.append(f"outputs differ from the uninterrupted run: {differ}")
        result.problems += self._verify(store)
        leftovers = [p.name for p in (store / "tmp").iterdir()] if (store / "tmp").exists() else []
        if leftovers:
            result.problems.append(f"scratch directories left behind: {leftovers}")
        if result.ok:
            shutil.rmtree(trial_dir, ignore_errors=True)
        return result


def run_trials(count: int, signals: list[str], seed: int, workdir: Path | None = None, jobs: int = 2,
               verify_cli: bool = True, env: dict[str, str] | None = None,
               log: bool = False, cli_verifications: int | None = None) -> tuple[Harness, list[Trial]]:
    """Run ``count`` trials that land a signal before the run ends (trials whose run finished first are redone)."""
    workdir = Path(workdir or tempfile.mkdtemp(prefix="trtflow-kill-"))
    harness = Harness(workdir, env or plugin_environment(workdir), jobs=jobs, verify_cli=verify_cli,
                      cli_verifications=cli_verifications)
    harness.make_reference()
    rng = random.Random(seed)
    trials: list[Trial] = []
    attempts = 0
    # every kill point in turn, each round of them shuffled: a count of len(POINTS) tries each point once, any count
    # covers start-up, before and after commits (a trial whose run finished first moves on to the next point)
    points: list[str] = []
    for _ in range(count // len(POINTS) + 2):
        points += rng.sample(POINTS, len(POINTS))
    while sum(t.interrupted for t in trials) < count and attempts < count * 3:
        sig = signals[attempts % len(signals)]
        point = points[attempts % len(points)]
        trial = harness.trial(attempts, sig, point)
        attempts += 1
        trials.append(trial)
        if log:
            state = "ok" if trial.ok else "FAILED: " + "; ".join(trial.problems)
            print(f"trial {trial.index:4d} SIG{sig.upper():4s} at {point:9s} "
                  f"{'interrupted' if trial.interrupted else 'finished first'}; "
                  f"{len(trial.committed_before)}/{len(NODES)} nodes committed before: {state}", flush=True)
    return harness, trials


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=200, help="kill points (signals that land mid-run)")
    parser.add_argument("--signal", choices=["kill", "int", "both"], default="both")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--verbose", "-v", action="store_true")
    args = parser.parse_args(argv)
    signals = ["kill", "int"] if args.signal == "both" else [args.signal]
    started = time.perf_counter()
    harness, trials = run_trials(args.count, signals, args.seed, args.workdir, args.jobs, log=args.verbose)
    interrupted = [t for t in trials if t.interrupted]
    good = [t for t in interrupted if t.ok]
    bad = [t for t in trials if not t.ok]
    by_signal = {s: sum(1 for t in interrupted if t.signal == s) for s in signals}
    partial = sum(1 for t in interrupted if 0 < len(t.committed_before) < len(NODES))
    startup = sum(1 for t in interrupted if t.during_startup)
    print(f"reference run {harness.reference_seconds:.2f}s; {len(trials)} trials, signals landed mid-run: "
          f"{by_signal} ({startup} before the run was recorded, {partial} after some nodes were committed); "
          f"{time.perf_counter() - started:.0f}s total")
    for t in bad:
        print(f"trial {t.index} (SIG{t.signal.upper()} at {t.point}): " + "; ".join(t.problems))
    print(f"{len(good)}/{len(interrupted)} resumed identical")
    if bad:
        print(f"failed trials kept under {harness.workdir}")
    elif args.workdir is None:
        shutil.rmtree(harness.workdir, ignore_errors=True)
    return 0 if not bad and len(interrupted) >= args.count else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
