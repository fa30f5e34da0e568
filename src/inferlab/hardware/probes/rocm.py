"""AMD GPUs through ``rocm-smi`` (JSON where the version has it, else the text table)."""

from __future__ import annotations

import json
import re

from . import GpuInfo, ProbeReport, Runner, ToolUnavailable, run_tool

ARGS = ("--showproductname", "--showmeminfo", "vram")


def _card_name(fields: dict[str, str]) -> str:
    for key in ("Card Series", "Card series", "Card Model", "Card model", "Marketing Name", "Card SKU"):
        if fields.get(key) and not str(fields[key]).startswith("0x"):
            return str(fields[key]).strip()
    return "unknown AMD GPU"


def parse_rocm_smi_json(text: str) -> list[GpuInfo]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolUnavailable(f"rocm-smi --json printed something that is not JSON ({exc.msg})") from None
    gpus = []
    for key, fields in data.items():
        if not key.replace(":", "").startswith("card") or not isinstance(fields, dict):
            continue  # "system": driver version
        total, used = str(fields.get("VRAM Total Memory (B)")), str(fields.get("VRAM Total Used Memory (B)"))  # "None" when absent
        total_b = int(total) if total.isdigit() else None
        used_b = int(used) if used.isdigit() else None
        gpus.append(GpuInfo(name=_card_name(fields), vendor="AMD", index=len(gpus), memory_total_bytes=total_b,
                            memory_free_bytes=total_b - used_b if total_b is not None and used_b is not None else None,
                            source="rocm-smi --json"))
    return gpus


def parse_rocm_smi_text(text: str) -> list[GpuInfo]:
    """The table form: 'GPU[0]  : VRAM Total Memory (B): 25753026560' and 'Card series: ...' lines."""
    cards: dict[int, dict[str, str]] = {}
    for m in re.finditer(r"^GPU\[(\d+)\]\s*:\s*(.+?):\s*(.*)$", text, flags=re.M):
        cards.setdefault(int(m.group(1)), {})[m.group(2).strip()] = m.group(3).strip()
    gpus = []
    for idx in sorted(cards):
        fields = cards[idx]
        total, used = fields.get("VRAM Total Memory (B)", ""), fields.get("VRAM Total Used Memory (B)", "")
        total_b = int(total) if total.isdigit() else None
        used_b = int(used) if used.isdigit() else None
        gpus.append(GpuInfo(name=_card_name(fields) if any("Card" in k for k in fields) else f"AMD GPU {idx}", vendor="AMD",
                            index=idx, memory_total_bytes=total_b,
                            memory_free_bytes=total_b - used_b if total_b is not None and used_b is not None else None,
                            source="rocm-smi"))
    return gpus


def probe_rocm(runner: Runner = run_tool) -> tuple[list[GpuInfo], list[ProbeReport]]:
    try:
        out = runner(["rocm-smi", *ARGS, "--json"])
        gpus = parse_rocm_smi_json(out)
    except ToolUnavailable as exc:
        if "not installed" in str(exc):
            return [], [ProbeReport("rocm-smi", False, str(exc))]
        try:
            gpus = parse_rocm_smi_text(runner(["rocm-smi", *ARGS]))
        except ToolUnavailable as exc2:
            return [], [ProbeReport("rocm-smi", False, str(exc2))]
    return gpus, [ProbeReport("rocm-smi", True, f"{len(gpus)} AMD GPU(s)")]
