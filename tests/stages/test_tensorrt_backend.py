"""The TensorRT flavour helper: resolving, importing through Polygraphy, provenance and its checks."""

from __future__ import annotations

import re
import sys

import pytest

from trtflow.environment import GpuInfo, gpus, module_available
from trtflow.stage import EnvironmentUnavailable, RecipeError, StageFailed, StageSkipped
from trtflow_stages.runtimes import tensorrt as trtb

needs_rtx = pytest.mark.skipif(not module_available("tensorrt_rtx"), reason="needs tensorrt-rtx")

H100 = GpuInfo(index=0, name="NVIDIA H100 80GB HBM3", compute_capability="9.0", driver="580.65", memory_mib=81559)
L4 = GpuInfo(index=0, name="NVIDIA L4", compute_capability="8.9", driver="580.65", memory_mib=23034)
T4 = GpuInfo(index=0, name="Tesla T4", compute_capability="7.5", driver="580.65", memory_mib=15360)


def test_available_backends_and_resolution():
    available = trtb.available_backends()
    assert available == [f for f in ("tensorrt", "tensorrt-rtx") if module_available(trtb._MODULES[f])]
    if available:
        assert trtb.resolve_backend("auto") == available[0]
    for flavour in ("tensorrt", "tensorrt-rtx"):
        if flavour in available:
            assert trtb.resolve_backend(flavour) == flavour
        else:
            with pytest.raises(StageSkipped) as info:
                trtb.resolve_backend(flavour)
            assert info.value.needs == trtb.INSTALL_HINTS[flavour]
    with pytest.raises(RecipeError, match="unknown TensorRT backend 'tensorrt_rtx'") as info:
        trtb.resolve_backend("tensorrt_rtx")
    assert info.value.hint == "did you mean 'tensorrt-rtx'?"


def test_fact_names_and_strong_typing():
    assert trtb.fact_name("tensorrt") == "tensorrt"
    assert trtb.fact_name("tensorrt-rtx") == "tensorrt_rtx"
    assert not trtb.is_strongly_typed_only("tensorrt", "10.13.0.35")
    assert trtb.is_strongly_typed_only("tensorrt", "11.0.0")
    assert trtb.is_strongly_typed_only("tensorrt-rtx", "1.7.1.116")


def test_timing_cache_name_names_flavour_version_and_gpu():
    name = trtb.timing_cache_name("tensorrt", "10.13.0")
    found = gpus()
    if found:
        assert name == f"timing/tensorrt-10.13.0-{re.sub('[^A-Za-z0-9.]+', '_', found[0].name)}_{found[0].sm}.cache"
    else:
        assert name == "timing/tensorrt-10.13.0-cpu.cache"


@needs_rtx
def test_import_trt_is_repeatable_and_sets_polygraphy_up_for_rtx():
    first = trtb.import_trt("tensorrt-rtx")
    again = trtb.import_trt("tensorrt-rtx")
    assert first is again and first.__name__ == "tensorrt_rtx"
    import polygraphy.config

    assert polygraphy.config.USE_TENSORRT_RTX is True
    from polygraphy.backend.trt import loader

    assert loader.trt.__version__ == first.__version__  # Polygraphy's lazy module is TensorRT-RTX


@needs_rtx
def test_import_trt_refuses_to_switch_flavour_once_polygraphy_is_bound(monkeypatch):
    trtb.import_trt("tensorrt-rtx")
    assert "polygraphy.backend.trt" in sys.modules
    monkeypatch.setattr(sys.modules["polygraphy.config"], "USE_TENSORRT_RTX", False)
    with pytest.raises(EnvironmentUnavailable, match="already bound to tensorrt in this process") as info:
        trtb.import_trt("tensorrt-rtx")
    assert "separate processes" in info.value.hint


@pytest.fixture
def rtx_manifest() -> dict:
    trt = trtb.import_trt("tensorrt-rtx")
    return trtb.provenance("tensorrt-rtx", trt, {"builder": {"precision": "strongly-typed"}})


@needs_rtx
def test_provenance_records_where_the_engine_was_built(rtx_manifest):
    assert rtx_manifest["backend"] == "tensorrt-rtx"
    assert rtx_manifest["version"] == trtb.installed_version("tensorrt-rtx")
    assert rtx_manifest["strongly_typed_only"] is True
    assert rtx_manifest["cuda"].startswith("13 (from tensorrt_rtx_cu13")
    assert rtx_manifest["builder"] == {"precision": "strongly-typed"}
    if not gpus():
        assert rtx_manifest["gpu"] == "none: built on CPU" and rtx_manifest["driver"] == "none"


@needs_rtx
def test_check_provenance_accepts_a_matching_engine(rtx_manifest):
    trtb.check_provenance(rtx_manifest, "tensorrt-rtx")
    trtb.check_provenance(rtx_manifest, "tensorrt-rtx", machine_gpus=[L4])  # default targets: RTX decides


@needs_rtx
def test_check_provenance_names_the_version_that_differs(rtx_manifest):
    installed = trtb.installed_version("tensorrt-rtx")
    old = {**rtx_manifest, "version": "1.6.0.12"}
    with pytest.raises(StageFailed) as info:
        trtb.check_provenance(old, "tensorrt-rtx")
    here = ".".join(installed.split(".")[:3])
    assert f"engine built for tensorrt-rtx 1.6.0 but this machine has {here}" in info.value.message
    assert "`trtflow run` re-builds it" in info.value.hint and "'tensorrt_rtx' fact" in info.value.hint

    with pytest.raises(StageFailed, match="engine built with tensorrt-rtx but this run uses tensorrt"):
        trtb.check_provenance(rtx_manifest, "tensorrt")


@needs_rtx
def test_check_provenance_rtx_compute_capability_targets(rtx_manifest):
    targeted = {**rtx_manifest, "builder": {"compute_capabilities": ["8.6", "12.0"]}}
    trtb.check_provenance(targeted, "tensorrt-rtx", machine_gpus=[GpuInfo(0, "RTX 5090", "12.0", "580", 32000)])
    with pytest.raises(StageFailed, match=r"built for compute capabilities 8.6, 12.0 but this machine's GPU "
                                          r"NVIDIA L4 has compute capability 8.9") as info:
        trtb.check_provenance(targeted, "tensorrt-rtx", machine_gpus=[L4])
    assert "add '8.9' to compute_capabilities" in info.value.hint


def full_trt_manifest(**builder) -> dict:
    return {"backend": "tensorrt", "version": "10.13.0.35", "builder": builder,
            "gpu": {"name": H100.name, "compute_capability": "9.0", "driver": "580.65"}}


def test_check_provenance_for_full_tensorrt_gpu_and_versions():
    manifest = full_trt_manifest()
    trtb.check_provenance(manifest, "tensorrt", version="10.13.0.35", machine_gpus=[H100])
    with pytest.raises(StageFailed, match=r"engine built for tensorrt 10.13.0 but this machine has 10.14.1"):
        trtb.check_provenance(manifest, "tensorrt", version="10.14.1.48", machine_gpus=[H100])
    with pytest.raises(StageFailed, match=r"built for GPU NVIDIA H100 80GB HBM3 \(compute capability 9.0\) but this "
                                          r"machine's GPU NVIDIA L4 has compute capability 8.9"):
        trtb.check_provenance(manifest, "tensorrt", version="10.13.0.35", machine_gpus=[L4])

    portable = full_trt_manifest(hardware_compatibility="ampere+", version_compatible=True)
    trtb.check_provenance(portable, "tensorrt", version="10.14.1.48", machine_gpus=[L4])
    with pytest.raises(StageFailed, match=r"needs compute capability 8.0 or newer, but this machine's GPU Tesla T4"):
        trtb.check_provenance(portable, "tensorrt", version="10.13.0.35", machine_gpus=[T4])
    with pytest.raises(StageFailed, match=r"engine built for tensorrt 10.13.0 but this machine has 11.0.0"):
        trtb.check_provenance(portable, "tensorrt", version="11.0.0.1", machine_gpus=[L4])
