"""Remote cache: time to push a node to a remote and pull it into a fresh store, against copying and hashing.

For each object size, a store commits a node with one object of that many MB (random bytes), then:
  - copy:  shutil.copyfile of the object (what `cp` from a shared folder costs, without any check);
  - hash:  xxh3-128 of the object (the check every pull does, and what re-hashing a local copy costs);
  - boto3 upload / download: the object through boto3's managed transfer (what `aws s3 cp` does), no checks;
  - push / pull through a directory remote (a folder on this disk, as an NFS mount or a CI cache folder is
    used), the same with objects named and verified by sha256 (`--remote-digest sha256`), and through an S3
    remote (moto's S3 server, started here on localhost as a separate process).
A push uploads the objects put-if-absent (synced to disk for a directory), then the manifest. A pull is the
whole hit path: look the key up, download to a temporary file, check size and digest, rename into objects/,
write the manifest. Each figure is the median of --repeat runs (with the fastest and slowest), each into a fresh
remote and a fresh store.
Everything is on this host, so the figures show the overhead of trtflow, the libraries and the server, not a
network's; against moto the S3 figures are bound by moto's own speed (compare the boto3 columns).

    python bench/remote_cache.py                    # 50 MB and 500 MB, 3 repeats
    python bench/remote_cache.py --sizes 50 --repeat 5
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from trtflow.fingerprint import hash_file_content, hash_text
from trtflow.storage.remote import RemoteCache
from trtflow.storage.store import Store

MB = 10**6
S3_BUCKET = "bench"


def write_random(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        left = size
        while left:
            chunk = min(left, 16 * 2**20)
            f.write(os.urandom(chunk))
            left -= chunk


def timed(action: Callable[..., object], *args: object) -> float:
    start = time.perf_counter()
    action(*args)
    return time.perf_counter() - start


def pull_node(cache: RemoteCache, key: str, store: Store) -> None:
    """What a run does on a stale node: look its key up remotely and pull the hit."""
    manifest = cache.get_manifest(key)
    assert manifest is not None, "the pushed node is not found"
    cache.pull(manifest, store)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    """moto's S3 server as a separate process on a free localhost port; yields its endpoint URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise SystemExit("moto's S3 server exited at start; is moto[server] installed?")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("moto's S3 server did not start listening within 60 s") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@dataclass
class Remote:
    """A kind of remote: a URL for a fresh remote under a name, and how to delete it again."""

    url_for: Callable[[str], str]
    remove: Callable[[str], None]
    digest: str | None = None  # the hash the remote names objects by (None: xxh3-128)


def measure(size_mb: int, work: Path, remotes: dict[str, Remote], repeat: int) -> dict[str, list[float]]:
    """Seconds of each operation, per run, on one node holding a single object of ``size_mb`` MB."""
    producer = Store(work / "producer")
    producer.ensure()
    scratch = work / "scratch"
    scratch.mkdir()
    write_random(scratch / "model.engine", size_mb * MB)
    key = hash_text(f"bench node {size_mb} MB")
    manifest = producer.commit(key, {"stage": "bench"}, scratch, {"engine": ("model.engine", "engine")})
    obj = producer.object_path(manifest["outputs"]["engine"]["digest"])
    copy_target = work / "copy.bin"
    client = None
    if "s3" in remotes:
        import boto3

        client = boto3.client("s3")

    samples: dict[str, list[float]] = {}
    for i in range(repeat):
        samples.setdefault("copy", []).append(timed(shutil.copyfile, obj, copy_target))
        copy_target.unlink()
        samples.setdefault("hash", []).append(timed(hash_file_content, obj))
        if client is not None:  # the object through boto3's managed transfer (what `aws s3 cp` does), no checks
            name = f"boto3/{size_mb}mb-{i}"
            samples.setdefault("boto3 upload", []).append(timed(client.upload_file, str(obj), S3_BUCKET, name))
            samples.setdefault("boto3 download", []).append(
                timed(client.download_file, S3_BUCKET, name, str(copy_target)))
            copy_target.unlink()
            client.delete_object(Bucket=S3_BUCKET, Key=name)
        for kind, remote in remotes.items():
            url = remote.url_for(f"{size_mb}mb-{i}")
            cache = RemoteCache(url, digest=remote.digest)
            cache.check()  # connected before timing: a run opens its remote once, then moves many nodes
            consumer = Store(work / "consumer")
            consumer.ensure()
            samples.setdefault(f"{kind} push", []).append(timed(cache.push, key, producer))
            samples.setdefault(f"{kind} pull", []).append(timed(pull_node, cache, key, consumer))
            assert consumer.intact(manifest)
            assert {n: o["digest"] for n, o in consumer.read_manifest(key)["outputs"].items()} == \
                {n: o["digest"] for n, o in manifest["outputs"].items()}
            shutil.rmtree(consumer.root)
            remote.remove(url)  # moto keeps objects in memory: one copy at a time
    shutil.rmtree(producer.root)
    shutil.rmtree(scratch)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 500], help="object sizes in MB")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-s3", action="store_true", help="only the directory remote")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="trtflow-remote-bench-") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)

        def directory_url(name: str) -> str:
            root = work / "remote" / name
            root.mkdir(parents=True)
            return str(root)

        remotes = {"dir": Remote(directory_url, shutil.rmtree),
                   "dir sha256": Remote(directory_url, shutil.rmtree, "sha256")}
        if not args.no_s3:
            endpoint = stack.enter_context(s3_server())
            os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                              AWS_DEFAULT_REGION="us-east-1")
            import boto3
            import s3fs

            boto3.client("s3").create_bucket(Bucket=S3_BUCKET)
            fs = s3fs.S3FileSystem(skip_instance_cache=True)
            remotes["s3"] = Remote(lambda name: f"s3://{S3_BUCKET}/{name}", lambda url: fs.rm(url, recursive=True))
        rows = [(size, measure(size, work, remotes, args.repeat)) for size in args.sizes]

    groups = [("local disk", ["copy", "hash"]), ("directory remote", ["dir push", "dir pull"]),
              ("directory remote, objects named by sha256", ["dir sha256 push", "dir sha256 pull"])]
    if not args.no_s3:
        groups.append(("S3 (moto server on localhost)", ["boto3 upload", "boto3 download", "s3 push", "s3 pull"]))
    print(f"seconds: median [fastest, slowest] of {args.repeat} runs (MB/s of the median)")
    for title, columns in groups:
        print(f"\n{title}")
        print(f"{'object':>8} " + " ".join(f"{c:>30}" for c in columns))
        for size, figures in rows:
            cells = [_cell(size, figures[c]) for c in columns]
            print(f"{size:>5} MB " + " ".join(f"{cell:>30}" for cell in cells))
    print("\npush = objects put-if-absent (synced to disk for a directory) + manifest; pull = lookup + download + "
          "size and digest check + rename into the store + manifest; copy, hash and boto3 each do one part, "
          "with no check")
    return 0


def _cell(size_mb: int, seconds: list[float]) -> str:
    median = statistics.median(seconds)
    return f"{median:6.3f} [{min(seconds):6.3f}, {max(seconds):6.3f}] ({size_mb / median:5.0f})"


if __name__ == "__main__":
    sys.exit(main())
