"""Loaded first by every Python of `engine_vs_vllm.py --isa avx2` (on its PYTHONPATH): torch answers that this
processor has no AVX-512 and no AMX, so vLLM loads its AVX2 kernels (`vllm._C_AVX2`) as on a processor without them.
oneDNN, MKL and ATen are held to AVX2 by their own variables, which the benchmark sets."""

import torch

for _name in ("_is_avx512_supported", "_is_avx512_vnni_supported", "_is_avx512_bf16_supported",
              "_is_amx_tile_supported", "_is_amx_fp16_supported"):  # fmt: skip
    if hasattr(torch.cpu, _name):
        setattr(torch.cpu, _name, lambda: False)
