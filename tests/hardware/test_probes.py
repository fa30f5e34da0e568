"""The probes' parsers on recorded tool outputs (fixtures/README.md says where each came from),
and the probes degrading to a reason when a tool is missing or broken."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferlab.hardware.probes import GpuInfo, ToolUnavailable, parse_size_bytes, pcie_gbs, run_tool
from inferlab.hardware.probes.apple import apple_chip, cpu_from_sysctl, parse_sysctl, parse_system_profiler_displays, probe_apple
from inferlab.hardware.probes.cpu import parse_lscpu, parse_proc_cpuinfo, probe_cpu
from inferlab.hardware.probes.memory import parse_proc_meminfo, probe_memory
from inferlab.hardware.probes.nvidia import CSV_FIELDS, parse_nvidia_smi_csv, parse_nvidia_smi_xml, probe_nvidia, read_nvml
from inferlab.hardware.probes.rocm import parse_rocm_smi_json, parse_rocm_smi_text, probe_rocm

FIX = Path(__file__).parent / "fixtures"
MIB = 2**20


def fixture(name: str) -> str:
    return (FIX / name).read_text()


def replay(outputs: dict[str, str]):
    """A runner that answers from recorded outputs, keyed by the tool's name; others are missing."""

    def run(argv):
        if argv[0] not in outputs:
            raise ToolUnavailable(f"{argv[0]} is not installed (not on PATH)")
        return outputs[argv[0]]

    return run


# ------------------------------------------------------------------ CPU

def test_lscpu_of_this_kind_of_machine_amd_epyc_two_cores_avx2_no_avx512_no_amx():
    cpu = parse_lscpu(fixture("lscpu_epyc_2vcpu_kvm.txt"))
    assert (cpu.model, cpu.vendor, cpu.arch) == ("AMD EPYC", "AuthenticAMD", "x86_64")
    assert (cpu.physical_cores, cpu.logical_cores) == (2, 2)
    assert cpu.has("avx2") and cpu.has("fma") and not cpu.has("avx512") and not cpu.has("amx")
    assert cpu.l3_bytes == 32 * MIB and cpu.hypervisor == "KVM" and cpu.simd == "avx2"


def test_lscpu_of_a_sapphire_rapids_class_xeon_sees_amx_avx512_and_hyperthreads():
    cpu = parse_lscpu(fixture("lscpu_xeon_8573c_2vcpu_azure.txt"))
    assert cpu.model == "INTEL(R) XEON(R) PLATINUM 8573C"
    assert (cpu.physical_cores, cpu.logical_cores) == (1, 2)  # 1 core x 2 threads
    for f in ("avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx", "amx_int8", "amx_bf16"):
        assert cpu.has(f), f
    assert cpu.simd == "amx" and cpu.max_mhz == 2300.0 and cpu.l3_bytes == 260 * MIB


def test_proc_cpuinfo_agrees_with_lscpu_on_the_same_machine():
    a = parse_lscpu(fixture("lscpu_epyc_2vcpu_kvm.txt"))
    b = parse_proc_cpuinfo(fixture("proc_cpuinfo_epyc_2vcpu_kvm.txt"))
    assert (a.model, a.physical_cores, a.logical_cores, a.features) == (b.model, b.physical_cores, b.logical_cores, b.features)
    assert b.max_mhz == pytest.approx(2445.402)


def test_arm_proc_cpuinfo_features_map_to_neon_dotprod_i8mm():
    text = "processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp i8mm bf16\nCPU implementer\t: 0x61\n"
    cpu = parse_proc_cpuinfo(text, arch="aarch64")
    assert set(cpu.features) == {"neon", "dotprod", "i8mm", "bf16"} and cpu.simd == "neon"


def test_cpu_probe_falls_back_to_proc_cpuinfo_when_lscpu_is_missing(tmp_path):
    p = tmp_path / "cpuinfo"
    p.write_text(fixture("proc_cpuinfo_epyc_2vcpu_kvm.txt"))
    cpu, reports = probe_cpu(replay({}), cpuinfo_path=str(p))
    assert cpu is not None and cpu.source == "/proc/cpuinfo" and cpu.logical_cores == 2
    assert reports[0].probe == "lscpu" and not reports[0].ok and "not installed" in reports[0].detail


def test_cpu_probe_with_nothing_to_read_still_answers_with_reasons(tmp_path):
    cpu, reports = probe_cpu(replay({}), cpuinfo_path=str(tmp_path / "missing"))
    assert cpu is not None and cpu.model == "unknown" and cpu.features == ()
    assert [r.ok for r in reports] == [False, False, True]
    assert "cannot read" in reports[1].detail


# ------------------------------------------------------------------ memory

def test_proc_meminfo_kib_units():
    mem = parse_proc_meminfo(fixture("proc_meminfo_epyc_2vcpu_kvm.txt"))
    first = fixture("proc_meminfo_epyc_2vcpu_kvm.txt").splitlines()[0]
    assert mem.total_bytes == int(first.split()[1]) * 1024
    assert 0 < mem.available_bytes <= mem.total_bytes


def test_psutil_reading_matches_the_kernel():
    mem, reports = probe_memory()
    kernel = parse_proc_meminfo(Path("/proc/meminfo").read_text())
    assert reports[0].ok and mem.total_bytes == kernel.total_bytes


# ------------------------------------------------------------------ NVIDIA

def test_nvidia_smi_xml_of_an_l4():
    (gpu,) = parse_nvidia_smi_xml(fixture("nvidia_smi_q_x_l4.xml"))
    assert gpu.name == "NVIDIA L4" and gpu.vendor == "NVIDIA"
    assert gpu.memory_total_bytes == 23034 * MIB and gpu.memory_free_bytes == 22601 * MIB
    assert (gpu.pcie_gen_max, gpu.pcie_width_max) == (4, 16)
    assert pcie_gbs(gpu.pcie_gen_max, gpu.pcie_width_max) == pytest.approx(31.5, abs=0.05)  # gen4 x16


def test_nvidia_smi_csv_with_header_of_eight_h100s():
    gpus = parse_nvidia_smi_csv(fixture("nvidia_smi_csv_8x_h100.csv"))
    assert len(gpus) == 8 and [g.index for g in gpus] == list(range(8))
    assert {g.name for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert gpus[0].memory_total_bytes == 81559 * MIB and gpus[0].pcie_gen_max is None


def test_nvidia_smi_csv_without_header_uses_the_query_fields():
    fields = ("index", "name", "memory.total", "compute_cap", "driver_version")
    gpus = parse_nvidia_smi_csv(fixture("nvidia_smi_csv_noheader_2x_l40s.csv"), fields)
    assert [(g.index, g.name, g.memory_total_bytes) for g in gpus] == [(0, "NVIDIA L40S", 46068 * MIB), (1, "NVIDIA L40S", 46068 * MIB)]


def test_nvidia_smi_csv_na_memory_is_unknown_not_zero():
    (gpu,) = parse_nvidia_smi_csv("NVIDIA GB10, [N/A], [N/A], 5, 16, 1, 16", CSV_FIELDS[1:])
    assert gpu.memory_total_bytes is None and gpu.pcie_gen_max == 5


class RecordedNVML:
    """nvidia-ml-py's module surface, answering with the values recorded from the L4 above
    (NVML is what nvidia-smi itself reads); one field refuses, as on boards that lack it."""

    class NVMLError(Exception):
        pass

    class _Mem:
        total, free, used = 23034 * MIB, 22601 * MIB, 1 * MIB

    def __init__(self, fail_init: bool = False):
        self.fail_init, self.shut = fail_init, False

    def nvmlInit(self):
        if self.fail_init:
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("handle", i)

    def nvmlDeviceGetName(self, h):
        return "NVIDIA L4"

    def nvmlDeviceGetMemoryInfo(self, h):
        return self._Mem()

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return 4

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return 16

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return 16


def test_nvml_reader_agrees_with_nvidia_smi_xml_of_the_same_gpu():
    nvml = RecordedNVML()
    (a,) = read_nvml(nvml)
    (b,) = parse_nvidia_smi_xml(fixture("nvidia_smi_q_x_l4.xml"))
    assert (a.name, a.memory_total_bytes, a.memory_free_bytes, a.pcie_gen_max, a.pcie_width_max) == \
           (b.name, b.memory_total_bytes, b.memory_free_bytes, b.pcie_gen_max, b.pcie_width_max)
    assert a.pcie_gen_current is None  # the refused field stays unknown
    assert nvml.shut


def test_nvidia_probe_falls_back_from_nvml_to_nvidia_smi_xml():
    gpus, reports = probe_nvidia(replay({"nvidia-smi": fixture("nvidia_smi_q_x_l4.xml")}), nvml=RecordedNVML(fail_init=True))
    assert [g.name for g in gpus] == ["NVIDIA L4"]
    assert not reports[0].ok and "Shared Library Not Found" in reports[0].detail and reports[1].ok


def test_nvidia_probe_falls_back_to_csv_when_the_xml_is_broken():
    def run(argv):
        return "<nvidia_smi_log><gpu>" if "-x" in argv else "0, NVIDIA L40S, 46068, 45000, 4, 16, 1, 16\n"

    gpus, reports = probe_nvidia(run, nvml=RecordedNVML(fail_init=True))
    assert [(g.name, g.memory_free_bytes, g.pcie_gen_max) for g in gpus] == [("NVIDIA L40S", 45000 * MIB, 4)]
    assert "not XML" in reports[1].detail


def test_nvidia_probe_on_a_machine_without_nvidia_reports_why():
    gpus, reports = probe_nvidia(replay({}), nvml=RecordedNVML(fail_init=True))
    assert gpus == [] and all(not r.ok for r in reports) and "not installed" in reports[-1].detail


# ------------------------------------------------------------------ Apple

def test_apple_m2_max_sysctl_and_system_profiler():
    chip = apple_chip(parse_sysctl(fixture("sysctl_apple_m2_max.txt")),
                      parse_system_profiler_displays(fixture("system_profiler_displays_apple_m2_max.txt")))
    assert chip.chip == "Apple M2 Max" and chip.gpu_cores == 38
    assert chip.unified_memory_bytes == 64 * 2**30
    assert (chip.performance_cores, chip.efficiency_cores) == (8, 4)


def test_apple_m1_pro_cpu_from_sysctl():
    cpu = cpu_from_sysctl(parse_sysctl(fixture("sysctl_apple_m1_pro_cpu.txt")))
    assert (cpu.model, cpu.vendor, cpu.arch) == ("Apple M1 Pro", "Apple", "arm64")
    assert (cpu.physical_cores, cpu.logical_cores) == (10, 10) and cpu.has("neon") and not cpu.has("avx2")


def test_system_profiler_m2_pro_gpu_cores():
    (gpu,) = parse_system_profiler_displays(fixture("system_profiler_displays_apple_m2_pro.txt"))
    assert (gpu.name, gpu.vendor, gpu.gpu_cores) == ("Apple M2 Pro", "Apple", 19)


def test_apple_probe_without_system_profiler_still_reads_sysctl():
    text = fixture("sysctl_apple_m1_pro_cpu.txt") + "hw.memsize: 17179869184\n"
    chip, cpu, reports = probe_apple(replay({"sysctl": text}))
    assert chip.chip == "Apple M1 Pro" and chip.gpu_cores is None and chip.unified_memory_bytes == 16 * 2**30
    assert [r.ok for r in reports] == [True, False]


# ------------------------------------------------------------------ AMD

def test_rocm_smi_text_table_two_gpus():
    gpus = parse_rocm_smi_text(fixture("rocm_smi_meminfo_vram_rx7900xtx.txt"))
    assert [(g.index, g.memory_total_bytes) for g in gpus] == [(0, 25753026560), (1, 2147483648)]
    assert gpus[0].memory_free_bytes == 25753026560 - 15960199168


def test_rocm_smi_json_skips_the_system_entry():
    gpus = parse_rocm_smi_json(fixture("rocm_smi_json_mi300x_rx7900xtx.json"))
    assert [g.name for g in gpus] == ["AMD Instinct MI300X", "Radeon RX 7900 XTX"]
    assert gpus[0].memory_total_bytes == 206141652992


def test_rocm_probe_falls_back_to_the_text_table():
    def run(argv):
        if "--json" in argv:
            raise ToolUnavailable("rocm-smi exited with 2: unrecognized arguments: --json")
        return fixture("rocm_smi_meminfo_vram_rx7900xtx.txt")

    gpus, reports = probe_rocm(run)
    assert len(gpus) == 2 and reports[0].ok


# ------------------------------------------------------------------ helpers

def test_run_tool_reports_missing_and_failing_tools_with_reasons():
    with pytest.raises(ToolUnavailable, match="not installed"):
        run_tool(["inferlab-no-such-tool-xyz"])
    with pytest.raises(ToolUnavailable, match="exited with 1"):
        run_tool(["false"])
    assert run_tool(["echo", "hi"]).strip() == "hi"


@pytest.mark.parametrize("text,expected", [("23034 MiB", 23034 * MIB), ("32 MiB (1 instance)", 32 * MIB),
                                           ("512 KB", 512 * 1024), ("N/A", None), ("", None)])
def test_parse_size_bytes(text, expected):
    assert parse_size_bytes(text) == expected


def test_pcie_rates_follow_the_generations():
    assert pcie_gbs(3, 16) == pytest.approx(15.75, abs=0.01)
    assert pcie_gbs(5, 16) == pytest.approx(2 * pcie_gbs(4, 16))
    assert pcie_gbs(None, 16) is None and pcie_gbs(9, 16) is None


def test_gpu_info_is_frozen():
    g = GpuInfo("x", "NVIDIA")
    with pytest.raises(AttributeError):
        g.name = "y"  # type: ignore[misc]
