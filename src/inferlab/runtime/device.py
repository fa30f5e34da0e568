"""Where the runtime runs and how much memory it used: device selection, and peak memory
measured from torch.cuda statistics on a GPU or from the process's peak RSS on a CPU."""

from __future__ import annotations

import os
import resource

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
