"""Whether CUDA can run here, and its libraries loaded where onnxruntime-gpu's wheels put them.

onnxruntime-gpu lists its CUDA provider wherever it is installed, with or without a GPU, so the
provider list alone would send ``auto`` to a provider that fails at the first session. The
driver answers the real question: how many devices it sees.
"""

from __future__ import annotations

import ctypes
import functools

import onnxruntime as ort

CUDA = "CUDAExecutionProvider"
_DRIVER_LIBRARIES = ("libcuda.so.1", "nvcuda.dll")


@functools.cache
def cuda_devices() -> int:
    """The GPUs the NVIDIA driver reports: 0 without the driver's library or without a device."""
    for name in _DRIVER_LIBRARIES:
        try:
            driver = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
        return count.value
    return 0


def cuda_usable() -> bool:
    """This onnxruntime build has the CUDA provider and the driver sees a GPU."""
    return CUDA in ort.get_available_providers() and cuda_devices() > 0


@functools.cache
def load_cuda_libraries() -> None:
    """Load the CUDA and cuDNN libraries of the ``nvidia-*`` wheels that onnxruntime-gpu's
    ``[cuda,cudnn]`` extras install: they live in site-packages, where the dynamic loader does
    not look, so without this the CUDA provider fails to load outside an image that sets
    LD_LIBRARY_PATH. Libraries already loadable (a system CUDA) are left to the loader."""
    preload = getattr(ort, "preload_dlls", None)  # onnxruntime >= 1.21
    if preload is not None:
        preload()
