"""cuda-python (``cuda.bindings``) at its smallest: the runtime module, whether a device is usable, and unpacking
its ``(err, *values)`` results into values or a `CudaError`. Imported lazily: nothing here loads CUDA at import."""

from __future__ import annotations

from typing import Any


class CudaError(RuntimeError):
    """A CUDA call failed, or work enqueued on a stream reported a failed enqueue."""


def runtime() -> Any:
    from cuda.bindings import runtime

    return runtime


def cuda_unavailable_reason() -> str | None:
    """None when cuda-python can reach a CUDA device here, else why not."""
    try:
        cudart = runtime()
    except ImportError as error:
        return f"cuda-python is not installed ({error}); install it with: pip install cuda-python"
    err, count = cudart.cudaGetDeviceCount()
    if err != cudart.cudaError_t.cudaSuccess:
        return f"no usable CUDA device: cudaGetDeviceCount returned {error_name(err)}"
    if count == 0:
        return "no CUDA device is visible"
    return None


def error_name(err: Any) -> str:
    cudart = runtime()
    try:
        name = cudart.cudaGetErrorName(err)[1]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # an unknown code: show what we have
        return str(err)


def check(result: Any, what: str) -> Any:
    """Unpack a cuda-python ``(err, *values)`` tuple, raising `CudaError` on an error."""
    cudart = runtime()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cudart.cudaError_t.cudaSuccess:
        raise CudaError(f"{what} failed: {error_name(err)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)
