"""Where the runtime runs and how much memory it used: device selection, peak memory measured
from torch.cuda statistics on a GPU or from the process's peak RSS on a CPU, and the exact peak
bytes of the tensors a block of code creates (any device)."""

from __future__ import annotations

from typing import Any

import os
import resource
import weakref
from functools import cache

from ..errors import InvalidValueError, NotSupportedError

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def select_device(name: str = "auto"):
    """'auto' picks CUDA when torch sees a GPU, else the CPU; 'cuda:1' names one GPU."""
    import torch

    kind = name.split(":", 1)[0]
    if kind not in DEVICE_CHOICES:
        raise InvalidValueError(f"device {name!r} is not one of {', '.join(DEVICE_CHOICES)} (or cuda:N)")
    if kind == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        raise NotSupportedError(f"device {name!r} requested but torch sees no CUDA device (torch {torch.__version__})")
    return torch.device(name)


def device_name(device) -> str:
    import platform

    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def _peak_rss_bytes() -> int:
    """VmHWM from /proc (resettable), else ru_maxrss (peak since the process started)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return _peak_rss_bytes()


class PeakMemory:
    """Context manager: peak bytes in use during the block.

    CUDA: torch.cuda.max_memory_allocated after reset_peak_memory_stats (tensors only).
    CPU: peak resident set size of the process (resets it through /proc/self/clear_refs where
    Linux allows; otherwise the peak since the process started, an upper bound).
    """

    def __init__(self, device):
        self.device = device
        self.peak_bytes = 0
        self.baseline_bytes = 0
        self.source = ""

    def __enter__(self):
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline_bytes = torch.cuda.memory_allocated(self.device)
            self.source = "torch.cuda.max_memory_allocated"
        else:
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
                self.source = "process peak RSS (VmHWM, reset)"
            except OSError:
                self.source = "process peak RSS since start (ru_maxrss)"
            self.baseline_bytes = current_rss_bytes()
        return self

    def __exit__(self, *exc):
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device)
        else:
            self.peak_bytes = _peak_rss_bytes()
        return False


@cache
def _tensor_bytes_mode():
    """TensorBytesPeak's dispatch mode class, made on first use (torch is imported lazily)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class _Mode(TorchDispatchMode):
        def __init__(self, meter):
            super().__init__()
            self.meter = meter

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs = {id(t.untyped_storage()) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and id(t.untyped_storage()) not in inputs:  # not a view or in-place result
                    self.meter._track(t.untyped_storage())
            return out

    return _Mode


class TensorBytesPeak:
    """Context manager: the peak of the bytes held by tensor storages created inside the block,
    counted exactly (each storage once, from the op that allocates it until torch frees it; views
    and in-place results, which share an input's storage, add nothing, so tensors made before the
    block never count). Unlike the process RSS it sees memory the allocator reuses, and unlike
    torch.cuda's statistics it works on any device. Every op pays a Python call: use it on a pass
    of its own, not on a timed one."""

    def __init__(self):
        self.live_bytes = 0
        self.peak_bytes = 0
        self._refs = {}  # id of a live storage -> its weak reference (kept so the callback fires)
        self._mode: Any = None

    def _track(self, storage) -> None:
        key, n = id(storage), storage.nbytes()  # storages keep one Python object for their life (torch preserves it)
        if key in self._refs or n == 0:
            return
        self._refs[key] = weakref.ref(storage, lambda _ref, key=key, n=n: self._free(key, n))
        self.live_bytes += n
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def _free(self, key, n) -> None:
        if self._refs.pop(key, None) is not None:
            self.live_bytes -= n

    def __enter__(self):
        self._mode = _tensor_bytes_mode()(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        return False
