"""The hardware catalog: devices (data/devices.json, each with a source) and the machines built
from them. A catalog machine is one GPU in a desktop with dual-channel DDR5, an Apple silicon
machine (unified memory), or a CPU-only host. Keys: "rtx4090", "m4max", "cpu-ddr5"...
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from ..models.catalog import Catalog
from .device import Device, Machine


def _device(e: dict, backend: str | None = None, lesson: bool = False) -> Device:
    fp16 = e.get("lesson", {}).get("fp16_tflops", e["fp16_tflops"]) if lesson else e["fp16_tflops"]
    return Device(
        e["name"], e["memory_gb"], e["bandwidth_gbs"], fp16, backend=backend or e["backend"],
        source=e["source"], n_cores=e.get("n_cores"), fp32_tflops=e.get("fp32_tflops"), vendor=e.get("vendor", ""),
        notes=e.get("fp16_note", ""),
    )


@cache
def _data() -> dict:
    return json.loads(resources.files("inferlab.data").joinpath("devices.json").read_text())


@cache
def load_devices() -> Catalog[Device]:
    return Catalog("device", {e["id"]: _device(e) for e in _data()["devices"]})


@cache
def load_hosts() -> Catalog[Device]:
    return Catalog("host memory preset", {e["id"]: _device(e) for e in _data()["hosts"]})


def apple_host(gpu: Device) -> Device:
    """The CPU's view of an Apple unified pool: same memory and bandwidth, CPU arithmetic."""
    return Device(f"{gpu.name} CPU", gpu.memory_gb, gpu.bandwidth_gbs, 1.0, backend="cpu", source=gpu.source,
                  notes="assumed 1 TFLOP/s CPU matmul throughput (NEON/AMX), as for desktop CPUs")


@cache
def load_machines(lesson: bool = False) -> Catalog[Machine]:
    """All catalog machines. lesson=True applies the seed lesson's own approximations where it
    used figures other than the vendor's (entries with a "lesson" block in devices.json)."""
    hosts = load_hosts()
    ddr5 = hosts["ddr5-dual"]
    machines: dict[str, Machine] = {}
    for e in _data()["devices"]:
        gpu = _device(e, lesson=lesson)
        pcie = e.get("lesson", {}).get("pcie_gbs", e.get("pcie_gbs")) if lesson else e.get("pcie_gbs")
        if gpu.backend == "metal":
            machines[e["id"]] = Machine(gpu.name, gpu, apple_host(gpu), 0.0, unified=True, source=e["source"])
        else:
            machines[e["id"]] = Machine(f"{gpu.name} + {ddr5.name}", gpu, ddr5, pcie, source=e["source"])
    machines["cpu-ddr5"] = Machine(f"CPU only, {ddr5.name}", None, ddr5, 0.0, source=ddr5.source)
    machines["cpu-ddr4"] = Machine(f"CPU only, {hosts['ddr4-dual'].name}", None, hosts["ddr4-dual"], 0.0, source=hosts["ddr4-dual"].source)
    machines["cpu-epyc"] = Machine(f"CPU only, {hosts['epyc-ddr5-12ch'].name}", None, hosts["epyc-ddr5-12ch"], 0.0, source=hosts["epyc-ddr5-12ch"].source)
    d = load_devices()
    machines["2x-rtx3090"] = Machine("2x RTX 3090 + DDR5", d["rtx3090"], ddr5, 31.5, extra_gpus=(d["rtx3090"],), source=d["rtx3090"].source)
    machines["2x-rtx4090"] = Machine("2x RTX 4090 + DDR5", d["rtx4090"], ddr5, 31.5, extra_gpus=(d["rtx4090"],), source=d["rtx4090"].source)
    return Catalog("machine", machines)


DEVICES = load_devices()
HOSTS = load_hosts()
MACHINES = load_machines()
LESSON_MACHINES = load_machines(lesson=True)
DDR5_DUAL = HOSTS["ddr5-dual"]
DDR4_DUAL = HOSTS["ddr4-dual"]
