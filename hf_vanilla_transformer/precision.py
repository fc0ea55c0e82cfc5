"""Whether this machine's CPU multiplies bfloat16 in hardware, which is when bfloat16 can pay off on a CPU.

x86 CPUs with AVX512-BF16 or AMX-BF16 units (recent Intel Xeons; AMD from Zen 4) multiply bfloat16 matrices several
times faster than float32 ones; on CPUs without them (the AMD EPYCs of AVX2 only seen here) torch converts bfloat16
to float32 for the arithmetic, which costs more than float32 alone.
"""

import torch


def cpu_has_bf16_units() -> bool:
    capabilities = torch.cpu.get_capabilities()
    return bool(capabilities.get("avx512_bf16") or capabilities.get("amx_bf16"))
