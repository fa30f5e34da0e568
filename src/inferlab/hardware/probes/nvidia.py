"""NVIDIA GPUs: NVML through nvidia-ml-py where installed, else ``nvidia-smi`` (XML, then CSV).

The NVML reader takes the module as an argument, so tests replay recorded values through it.
"""

from __future__ import annotations

import csv
import io
import xml.etree.ElementTree as ET
from typing import Any

from . import MIB, GpuInfo, ProbeReport, Runner, ToolUnavailable, parse_size_bytes, run_tool

# The CSV query the probe asks nvidia-smi for (the fallback when the XML form fails).
CSV_FIELDS = ("index", "name", "memory.total", "memory.free", "pcie.link.gen.max",
              "pcie.link.width.max", "pcie.link.gen.current", "pcie.link.width.current")


def _text(node: ET.Element | None, path: str) -> str | None:
    found = node.find(path) if node is not None else None
    return found.text.strip() if found is not None and found.text else None


def _int(text: str | None) -> int | None:
    if not text:
        return None
    digits = text.strip().rstrip("x").split()[0]
    return int(digits) if digits.isdigit() else None


def parse_nvidia_smi_xml(text: str) -> list[GpuInfo]:
    """Parse ``nvidia-smi -q -x``. Raises ToolUnavailable if it is not that document."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ToolUnavailable(f"nvidia-smi -q -x printed something that is not XML ({exc})") from None
    if root.tag != "nvidia_smi_log":
        raise ToolUnavailable(f"nvidia-smi -q -x printed <{root.tag}>, not <nvidia_smi_log>")
    gpus = []
    for i, gpu in enumerate(root.findall("gpu")):
        total, free = _text(gpu, "fb_memory_usage/total"), _text(gpu, "fb_memory_usage/free")
        link = gpu.find("pci/pci_gpu_link_info")
        gpus.append(GpuInfo(
            name=_text(gpu, "product_name") or "unknown NVIDIA GPU",
            vendor="NVIDIA",
            index=i,  # nvidia-smi numbers GPUs in document order
            memory_total_bytes=parse_size_bytes(total) if total else None,
            memory_free_bytes=parse_size_bytes(free) if free else None,
            pcie_gen_max=_int(_text(link, "pcie_gen/max_link_gen")),
            pcie_width_max=_int(_text(link, "link_widths/max_link_width")),
            pcie_gen_current=_int(_text(link, "pcie_gen/current_link_gen")),
            pcie_width_current=_int(_text(link, "link_widths/current_link_width")),
            source="nvidia-smi -q -x",
        ))
    return gpus


def parse_nvidia_smi_csv(text: str, fields: tuple[str, ...] | None = None) -> list[GpuInfo]:
    """Parse ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.

    With a header the columns name themselves ('memory.total [MiB]'); without one, pass the
    query's ``fields``. Memory without a unit is MiB (nvidia-smi's unit); '[N/A]' is unknown.
    """
    rows = [[c.strip() for c in r] for r in csv.reader(io.StringIO(text.strip())) if r]
    if not rows:
        return []
    if fields is None:
        fields = tuple(h.split(" [")[0].strip() for h in rows[0])
        rows = rows[1:]
    gpus = []
    for i, row in enumerate(rows):
        rec = dict(zip(fields, row))
        index = _int(rec.get("index"))
        gpus.append(GpuInfo(
            name=rec.get("name", "unknown NVIDIA GPU"),
            vendor="NVIDIA",
            index=index if index is not None else i,  # no (or no integer) index column: the row's position
            memory_total_bytes=_csv_mem(rec, "memory.total"),
            memory_free_bytes=_csv_mem(rec, "memory.free"),
            pcie_gen_max=_int(rec.get("pcie.link.gen.max")),
            pcie_width_max=_int(rec.get("pcie.link.width.max")),
            pcie_gen_current=_int(rec.get("pcie.link.gen.current")),
            pcie_width_current=_int(rec.get("pcie.link.width.current")),
            source="nvidia-smi --query-gpu",
        ))
    return gpus


def _csv_mem(rec: dict[str, str], key: str) -> int | None:
    """A memory column of the CSV in bytes: MiB without a unit (nvidia-smi's), None for '[N/A]' or empty."""
    v = rec.get(key)
    if not v or v.startswith("[") or v == "N/A":
        return None
    return parse_size_bytes(v) if not v.replace(".", "").isdigit() else int(float(v) * MIB)


def _nvml_ask(nvml: Any, handle: Any, fn: str, *args: Any) -> Any:
    """nvml.<fn>(handle, *args), None where NVML refuses it for this GPU (NOT_SUPPORTED...)."""
    try:
        return getattr(nvml, fn)(handle, *args)
    except nvml.NVMLError:
        return None


def read_nvml(nvml: Any) -> list[GpuInfo]:
    """Read every GPU through an NVML binding (the ``pynvml`` module of nvidia-ml-py).

    Raises ToolUnavailable (with NVML's own message) when the driver library cannot be loaded.
    Fields NVML refuses for one GPU (NOT_SUPPORTED on some boards) stay None.
    """
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise ToolUnavailable(f"NVML could not start: {exc}") from None
    try:
        gpus = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)

            def ask(fn: str, h: Any = h) -> Any:
                return _nvml_ask(nvml, h, fn)

            name = ask("nvmlDeviceGetName")
            mem = ask("nvmlDeviceGetMemoryInfo")
            gpus.append(GpuInfo(
                name=name.decode() if isinstance(name, bytes) else (name or "unknown NVIDIA GPU"),
                vendor="NVIDIA",
                index=i,
                memory_total_bytes=int(mem.total) if mem is not None else None,
                memory_free_bytes=int(mem.free) if mem is not None else None,
                pcie_gen_max=ask("nvmlDeviceGetMaxPcieLinkGeneration"),
                pcie_width_max=ask("nvmlDeviceGetMaxPcieLinkWidth"),
                pcie_gen_current=ask("nvmlDeviceGetCurrPcieLinkGeneration"),
                pcie_width_current=ask("nvmlDeviceGetCurrPcieLinkWidth"),
                source="nvml",
            ))
        return gpus
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def probe_nvidia(runner: Runner = run_tool, nvml: Any = None) -> tuple[list[GpuInfo], list[ProbeReport]]:
    """NVIDIA GPUs through NVML, else nvidia-smi. An empty list with reports saying why."""
    reports: list[ProbeReport] = []
    if nvml is None:
        try:
            import pynvml as nvml  # nvidia-ml-py
        except ImportError:
            reports.append(ProbeReport("nvml", False, "nvidia-ml-py is not installed (pip install 'inferlab[machine]')"))
    if nvml is not None:
        try:
            gpus = read_nvml(nvml)
            reports.append(ProbeReport("nvml", True, f"{len(gpus)} NVIDIA GPU(s)"))
            return gpus, reports
        except ToolUnavailable as exc:
            reports.append(ProbeReport("nvml", False, str(exc)))
    try:
        gpus = parse_nvidia_smi_xml(runner(["nvidia-smi", "-q", "-x"]))
        reports.append(ProbeReport("nvidia-smi", True, f"{len(gpus)} NVIDIA GPU(s) (XML)"))
        return gpus, reports
    except ToolUnavailable as exc:
        reports.append(ProbeReport("nvidia-smi -q -x", False, str(exc)))
        if "not installed" in str(exc):
            return [], reports
    try:
        out = runner(["nvidia-smi", f"--query-gpu={','.join(CSV_FIELDS)}", "--format=csv,noheader,nounits"])
        gpus = parse_nvidia_smi_csv(out, CSV_FIELDS)
        reports.append(ProbeReport("nvidia-smi", True, f"{len(gpus)} NVIDIA GPU(s) (CSV)"))
        return gpus, reports
    except ToolUnavailable as exc:
        reports.append(ProbeReport("nvidia-smi --query-gpu", False, str(exc)))
    return [], reports
