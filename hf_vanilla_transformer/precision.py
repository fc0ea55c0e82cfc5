"""Whether this machine's CPU multiplies bfloat16 in hardware, which is when bfloat16 can pay off on a CPU.

x86 CPUs with AVX512-BF16 or AMX-BF16 units (recent Intel Xeons; AMD from Zen 4) multiply bfloat16 matrices several
times faster than float32 ones; on CPUs without them (the AMD EPYCs of AVX2 only seen here) torch converts bfloat16
to float32 for the arithmetic, which costs more than float32 alone.
"""

from pathlib import Path

import torch

from .loading import default_device

BF16_UNITS = ("avx512_bf16", "amx_bf16")  # named alike by torch.cpu.get_capabilities() and Linux's /proc/cpuinfo


def cpu_has_bf16_units() -> bool:
    # torch.cpu.get_capabilities() arrived in torch 2.11; older torch answers only through private functions, so
    # there we read the flags Linux lists, and elsewhere say no: float32, the dtype that is right on every CPU
    if hasattr(torch.cpu, "get_capabilities"):
        capabilities = torch.cpu.get_capabilities()
        return any(capabilities.get(unit) for unit in BF16_UNITS)
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.exists() and not set(BF16_UNITS).isdisjoint(cpuinfo.read_text().split())


def translation_dtype(name: str, device: str | None) -> torch.dtype:
    """The dtype to load a model in for translating on `device` (None: cuda if available). "auto" is bfloat16 on a
    CPU with bfloat16 units, where generate() ran 1.33x as fast as float32 at the same test BLEU (BENCHMARKS.md,
    "bfloat16 on a CPU with bf16 units"), and float32 elsewhere (not measured faster at equal BLEU)."""
    if name != "auto":
        return getattr(torch, name)
    on_cpu = default_device(device).startswith("cpu")
    return torch.bfloat16 if on_cpu and cpu_has_bf16_units() else torch.float32
