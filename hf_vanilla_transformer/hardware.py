"""Devices and CPU probing, in one place: the device a command runs on, and what this machine's CPU is and can do."""

import os
from pathlib import Path

import torch

BF16_UNITS = ("avx512_bf16", "amx_bf16")  # named alike by torch.cpu.get_capabilities() and Linux's /proc/cpuinfo


def cpu_has_bf16_units() -> bool:
    """Whether this machine's CPU multiplies bfloat16 in hardware, which is when bfloat16 can pay off on a CPU: x86
    CPUs with AVX512-BF16 or AMX-BF16 units (recent Intel Xeons; AMD from Zen 4) multiply bfloat16 matrices faster
    than float32 ones; on CPUs without them (the AMD EPYCs of AVX2 only seen here) torch converts
    bfloat16 to float32 for the arithmetic, which costs more than float32 alone."""
    # torch.cpu.get_capabilities() arrived in torch 2.11; older torch answers only through private functions, so
    # there we read the flags Linux lists, and elsewhere say no: float32, the dtype that is right on every CPU
    if hasattr(torch.cpu, "get_capabilities"):
        capabilities = torch.cpu.get_capabilities()
        return any(capabilities.get(unit) for unit in BF16_UNITS)
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.exists() and not set(BF16_UNITS).isdisjoint(cpuinfo.read_text().split())


ONEDNN_KERNELS_KEPT = 16384  # oneDNN keeps 1,024


def keep_more_onednn_kernels() -> None:
    """Let oneDNN keep `ONEDNN_KERNELS_KEPT` kernels, unless ONEDNN_PRIMITIVE_CACHE_CAPACITY is set already.

    On a CPU with bfloat16 units torch multiplies bfloat16 matrices through oneDNN, which builds a kernel (a
    "primitive") for each shape and keeps the newest 1,024. Token-budget batches come in hundreds of shapes and a
    training step's products need dozens of kernels, so with 1,024 kept a run built them again in every epoch
    (BENCHMARKS.md, "oneDNN's kernels"). oneDNN reads the variable when it builds its first kernel: call this
    before the first bfloat16 product. float32 products do not go through oneDNN."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_KERNELS_KEPT))


def default_device(device: str | None) -> str:
    """`device`, or where none is given, cuda if available, else cpu."""

    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def check_torch_device(device: str) -> None:
    """Refuse a device torch does not find here (`check_device`)."""

    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    count = torch.accelerator.device_count()
    check_device(device, f"torch {torch.__version__}", accelerator and accelerator.type, count)


def parse_device(device: str):
    """`device` as a `torch.device`; a name torch does not read as one is a ValueError naming it."""

    try:
        return torch.device(device)
    except (RuntimeError, ValueError):  # torch's RuntimeError lists its twenty device types
        raise ValueError(f"device {device!r} is not a device name (cpu, cuda, cuda:1, mps, ...)") from None


def check_device(device: str, engine: str, accelerator: str | None, count: int):
    """`device` as a `torch.device`, refused where `engine` finds no such device: it finds `count` devices of type
    `accelerator` (None: none). Unchecked, torch fails at the first tensor moved there (an AssertionError for cuda on
    a CPU build) and CTranslate2 with a message that names no device."""
    parsed = parse_device(device)
    if parsed.type == "cpu":
        return parsed
    if parsed.type != accelerator or count < 1:
        raise ValueError(f"device {device}: {engine} finds no {parsed.type} device here")
    if parsed.index is not None and parsed.index >= count:
        raise ValueError(
            f"device {device}: {engine} finds {count} {parsed.type} device(s) here, "
            f"{parsed.type}:0 to {parsed.type}:{count - 1}"
        )
    return parsed


def cpu_name() -> str:
    """The CPU's model name as /proc/cpuinfo gives it ("CPU" where there is none)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        return "CPU"


def describe_hardware() -> str:
    """The accelerators or the CPU that trained the model, for the card."""
    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return f"{cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
