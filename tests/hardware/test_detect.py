"""detect: the Machine built from probes, catalog look-ups and the calibration profile; every
figure says where it came from. GPU and Apple paths replay recorded tool outputs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inferlab.errors import UnknownNameError
from inferlab.hardware.catalog import DEVICES, HOSTS
from inferlab.hardware.detect import _Both, inspect_machine, match_catalog
from inferlab.hardware.device import Machine
from inferlab.hardware.probes import ToolUnavailable

FIX = Path(__file__).parent / "fixtures"
CATALOG = _Both(DEVICES, HOSTS)
PROFILE = {"version": 1, "date": "2026-11-29T14:00:00+00:00",
           "cpu": {"read_bandwidth_gbs": {"1": {"median": 9.0}, "2": {"median": 12.5}},
                   "matmul_tflops": {"fp32": {"median": 0.11}, "bf16": {"median": 0.05}}}}


def replay(outputs: dict[str, str]):
    def run(argv):
        key = " ".join(argv[:2]) if " ".join(argv[:2]) in outputs else argv[0]
        if key not in outputs:
            raise ToolUnavailable(f"{argv[0]} is not installed (not on PATH)")
        return outputs[key]

    return run


class NoNVML:
    class NVMLError(Exception):
        pass

    def nvmlInit(self):
        raise self.NVMLError("NVML Shared Library Not Found")


LINUX_L4 = {"lscpu": (FIX / "lscpu_xeon_8573c_2vcpu_azure.txt").read_text(),
            "nvidia-smi": (FIX / "nvidia_smi_q_x_l4.xml").read_text()}


def test_this_machine_cpu_cores_ram_and_no_gpu():
    """Acceptance: on this machine the report has the CPU, cores, ISA, RAM and 'no GPU', all read."""
    d = inspect_machine(profile=PROFILE)
    lscpu = os.popen("lscpu").read()
    model = next(line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name"))
    assert d.cpu.model == model and d.cpu.logical_cores == os.cpu_count()
    flags = open("/proc/cpuinfo").read()
    assert d.cpu.has("avx2") == (" avx2" in flags) and d.cpu.has("amx") == (" amx_tile" in flags)
    assert d.cpu.has("avx512") == (" avx512f" in flags)
    said = {f.what: f.value for f in d.figures}
    assert said["AMX"] == ("yes" if " amx_tile" in flags else "no") and said["AVX-512"] == ("yes" if " avx512f" in flags else "no")
    assert d.machine.cpu_only and d.gpus == () and d.machine.gpu is None
    meminfo = int(open("/proc/meminfo").readline().split()[1]) * 1024
    assert d.machine.ram.memory_bytes == pytest.approx(meminfo, rel=1e-6)
    origins = {f.what: f.origin for f in d.figures}
    assert origins["RAM"] == "read: psutil" and origins["CPU"].startswith("read: lscpu")
    assert origins["GPU"].startswith("read:") and "not installed" in origins["GPU"]
    # the profile's figures, not guesses, for bandwidth and matmul
    assert d.machine.ram.bandwidth_gbs == 12.5 and d.machine.ram.fp32_tflops == 0.11
    assert origins["RAM bandwidth"].startswith("calibrated: profile local@20261129T1400Z of 2026-11-29")
    # no llama.cpp runs in this profile: the CPU kernel rates are the ISA class's reference, carried
    # here by the profile's matmul figures where the reference has them too, and the rates say so
    from inferlab.perf.cpu_model import rates_label

    assert "scaled by machine profile local@20261129T1400Z" in rates_label(d.machine.ram)
    assert "calibrated: " in origins["CPU kernel rates"]


def test_resolve_machine_local_is_the_library_entry_point():
    from inferlab.hardware.resolve import resolve_machine

    m = resolve_machine("local", profile=PROFILE)
    assert isinstance(m, Machine) and m.ram.is_cpu and m.name == "local"
    assert m.ram.n_cores == int(os.popen("lscpu -p=core | grep -v '^#' | sort -u | wc -l").read())


def test_linux_with_an_l4_reads_memory_and_pcie_and_looks_up_bandwidth():
    d = inspect_machine(runner=replay(LINUX_L4), nvml=NoNVML(), profile=PROFILE, catalog=CATALOG, system="Linux")
    gpu = d.machine.gpu
    assert gpu is not None and gpu.bandwidth_gbs == DEVICES["l4"].bandwidth_gbs
    assert gpu.memory_bytes == 23034 * 2**20  # the driver's figure replaces the catalog's 24 GB
    assert d.machine.pcie_gbs == pytest.approx(31.5, abs=0.05)
    read = {f.what for f in d.read}
    looked_up = {f.what for f in d.looked_up}
    assert {"GPU 0", "GPU 0 memory", "GPU 0 PCIe"} <= read
    assert {"GPU 0 bandwidth", "GPU 0 FP16 tensor"} <= looked_up
    assert d.cpu.has("amx") and d.cpu.physical_cores == 1


def test_the_catalog_device_can_be_forced():
    d = inspect_machine(gpu="rtx4090", runner=replay(LINUX_L4), nvml=NoNVML(), profile=PROFILE, catalog=CATALOG, system="Linux")
    assert d.machine.gpu.bandwidth_gbs == DEVICES["rtx4090"].bandwidth_gbs
    assert any(f.origin == "catalog: rtx4090 (forced)" for f in d.figures)
    with pytest.raises(UnknownNameError, match="rtx4090"):
        inspect_machine(gpu="rtx4909", runner=replay(LINUX_L4), nvml=NoNVML(), profile=PROFILE, catalog=CATALOG, system="Linux")


def test_forcing_a_gpu_on_a_machine_without_one():
    d = inspect_machine(gpu="rtx3090", runner=replay({}), nvml=NoNVML(), profile=PROFILE, catalog=CATALOG, system="Linux")
    assert d.machine.gpu == DEVICES["rtx3090"] and d.machine.pcie_gbs == pytest.approx(31.5, abs=0.05)
    with pytest.raises(UnknownNameError, match="rtx4090"):
        inspect_machine(gpu="rtx4909", runner=replay({}), nvml=NoNVML(), profile=PROFILE, catalog=CATALOG, system="Linux")


def test_forcing_a_host_preset_for_the_cpu():
    d = inspect_machine(cpu="ddr5-dual", runner=replay({}), nvml=NoNVML(), profile=None, catalog=CATALOG, system="Linux")
    assert d.machine.ram.bandwidth_gbs == HOSTS["ddr5-dual"].bandwidth_gbs
    with pytest.raises(UnknownNameError):
        inspect_machine(cpu="rtx4090", runner=replay({}), nvml=NoNVML(), profile=PROFILE, catalog=CATALOG, system="Linux")


def test_an_unknown_gpu_is_reported_and_left_out_not_guessed():
    def run(argv):
        if argv[0] == "nvidia-smi" and "-x" in argv:
            raise ToolUnavailable("nvidia-smi -q -x exited with 9: driver mismatch")
        if argv[0] == "nvidia-smi":  # the probe asks for its own CSV fields: answer in that order
            return "".join(f"{i}, NVIDIA L40S, 46068, 46000, 4, 16, 1, 16\n" for i in range(2))
        raise ToolUnavailable(f"{argv[0]} is not installed (not on PATH)")

    d = inspect_machine(runner=run, nvml=NoNVML(), profile=PROFILE, catalog=CATALOG, system="Linux")
    assert d.machine.gpu is None and d.unmatched_gpus == ("NVIDIA L40S", "NVIDIA L40S")
    assert any(f.what == "GPU 0 bandwidth, FLOPs" and f.origin.startswith("unknown:") and "--gpu" in f.origin for f in d.figures)


def test_apple_m2_max_is_one_unified_pool_with_the_detected_size():
    run = replay({"sysctl": (FIX / "sysctl_apple_m2_max.txt").read_text() + "machdep.cpu.brand_string: Apple M2 Max\n",
                  "system_profiler": (FIX / "system_profiler_displays_apple_m2_max.txt").read_text()})
    d = inspect_machine(runner=run, profile=PROFILE, catalog=CATALOG, system="Darwin")
    m = d.machine
    assert m.unified and m.gpu.backend == "metal" and m.gpu.bandwidth_gbs == DEVICES["m2max"].bandwidth_gbs
    assert m.gpu.memory_bytes == 64 * 2**30 and d.apple.gpu_cores == 38
    assert m.ram.memory_gb == m.gpu.memory_gb and m.pcie_gbs == 0.0


def test_apple_chip_with_another_gpu_core_count_picks_that_variant():
    assert match_catalog("Apple M3 Max (30-core GPU)", CATALOG, gpu_cores=30) == "m3max-30c"
    assert match_catalog("Apple M3 Max (40-core GPU)", CATALOG, gpu_cores=40) == "m3max"


@pytest.mark.parametrize("name,key", [
    ("NVIDIA GeForce RTX 4090", "rtx4090"), ("NVIDIA GeForce RTX 4060 Ti", "rtx4060ti"), ("NVIDIA GeForce RTX 4060", "rtx4060"),
    ("NVIDIA GeForce RTX 4070 Ti SUPER", "rtx4070tisuper"), ("NVIDIA H100 80GB HBM3", "h100"), ("Tesla T4", "t4"),
    ("NVIDIA L4", "l4"), ("NVIDIA L40S", None), ("AMD Radeon RX 7900 XTX", "rx7900xtx"), ("Radeon RX 7900 XT", None),
    ("AMD Instinct MI300X", None),
])
def test_match_catalog(name, key):
    assert match_catalog(name, CATALOG) == key


def test_a_missing_catalog_is_a_reason_not_a_crash():
    d = inspect_machine(runner=replay(LINUX_L4), nvml=NoNVML(), profile=PROFILE, catalog={}, system="Linux")
    assert d.machine.gpu is None and d.unmatched_gpus == ("NVIDIA L4",)


def test_a_profile_with_llama_cpp_rates_is_attached_and_no_profile_ignores_it():
    """The detected host's CPU rates are the profile's own llama.cpp fit, named by the profile's
    id and date; profile=False (`--no-profile`) gives the stored reference of the ISA class."""
    from inferlab.perf.cpu_model import cpu_decode_rate_bytes_per_s, rates_label, reference_for

    ref = {"id": "box@20261201T1400Z", "date": "2026-12-01T14:00:00+00:00", "simd": "avx512",
           "per_core_bytes_per_s": {"Q4_K": 31e9}, "parallel_efficiency": {"Q4_K": 0.9}, "overhead_s_per_layer": 5e-5,
           "decode_bw_eff": 0.75, "provenance": "llama.cpp CPU rates measured on this machine: machine profile box@20261201T1400Z "
                                                "of 2026-12-01T14:00:00+00:00"}
    profile = dict(PROFILE, date=ref["date"], host={"name": "box"}, llama_cpp={"reference": ref})
    ram = inspect_machine(profile=profile).machine.ram
    assert reference_for(ram) is ref and "box@20261201T1400Z" in rates_label(ram) and ref["date"] in rates_label(ram)
    assert cpu_decode_rate_bytes_per_s(ram, "Q4_K", 1) == 31e9
    assert cpu_decode_rate_bytes_per_s(ram, "IQ2_XXS", 1) == 31e9  # a type it did not measure: its stand-in, from the same rates
    plain = inspect_machine(profile=False).machine.ram
    assert reference_for(plain) is not ref and "box@" not in rates_label(plain) and "calibrated" not in plain.source


def test_the_machine_table_names_where_decode_leaves_the_cache():
    """A profile whose cache ladder found a ramp at 76-145 MB shows it beside lscpu's L3 (which a
    VM guest may read from its host: 480 MiB on the Xeon guest whose ladder stepped at 76-145 MB);
    a ladder with no step says up to where it looked; a profile without one shows neither."""
    base = {"id": "box@20261205T1400Z", "date": "2026-12-05T14:00:00+00:00", "simd": "avx512",
            "per_core_bytes_per_s": {"Q4_K": 31e9}, "parallel_efficiency": {"Q4_K": 0.9}, "overhead_s_per_layer": 5e-5,
            "decode_bw_eff": 0.75, "provenance": "llama.cpp CPU rates measured on this machine: machine profile box@20261205T1400Z"}

    def shown(ref: dict) -> list[str]:
        profile = dict(PROFILE, date=ref["date"], host={"name": "box"}, llama_cpp={"reference": ref})
        return [f.value for f in inspect_machine(profile=profile).figures if f.what == "decode cache"]

    assert shown(dict(base, dram_ramp_bytes=[76.3e6, 145.3e6], cache_ladder={"ladder_bytes": [35.5e6, 223.7e6] * 2})) == [
        "weights past 76-145 MB stream from DRAM"]
    assert shown(dict(base, dram_ramp_bytes=None, cache_ladder={"ladder_bytes": [35.5e6, 52.6e6, 69.7e6, 223.7e6]})) == [
        "no step up to 224 MB (larger models not verified)"]
    assert shown(base) == []
