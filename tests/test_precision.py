"""The bfloat16 check against what the kernel says of the CPU."""

from pathlib import Path

import pytest

from hf_vanilla_transformer.precision import cpu_has_bf16_units


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="reads Linux's /proc/cpuinfo")
def test_bf16_units_are_the_ones_proc_cpuinfo_lists():
    flags = set(Path("/proc/cpuinfo").read_text().split())
    assert cpu_has_bf16_units() == bool({"avx512_bf16", "amx_bf16"} & flags)
