"""`trtflow doctor`'s backend rows (what the built-in stages can build and run here) say what is true of this
machine's libraries, GPU or not."""

from __future__ import annotations

from trtflow.environment import GpuInfo
from trtflow_stages.runtimes import backends


def _torch_row(rows):
    return next(row for row in rows if row["backend"] == "torch")


def test_a_cpu_build_of_torch_is_not_called_cuda_when_a_gpu_is_listed(monkeypatch):
    # The GPU list comes from nvidia-smi; this machine has none, so the listing is what is substituted here.
    # The torch build is the real one installed (CI installs the CPU build).
    assert backends.torch_cuda_build() is None, "this test expects the CPU build of torch that CI installs"
    h100 = GpuInfo(index=0, name="NVIDIA H100 80GB HBM3", compute_capability="9.0", driver="580.159",
                   memory_mib=81559, uuid="GPU-0")
    monkeypatch.setattr(backends, "gpus", lambda: (h100,))
    why = _torch_row(backends.report())["why"]
    assert "CUDA" not in why.split(":")[0]
    assert "CPU build" in why and "GPU here is not used" in why


def test_cpu_build_without_a_gpu_runs_on_the_cpu(monkeypatch):
    monkeypatch.setattr(backends, "gpus", lambda: ())
    assert _torch_row(backends.report())["why"] == "CPU"


def test_cuda_build_is_read_from_torch_without_importing_it():
    import subprocess
    import sys

    code = ("import sys; from trtflow_stages.runtimes.backends import torch_cuda_build; "
            "print(torch_cuda_build(), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    import torch

    assert out == [str(torch.version.cuda), "False"]
