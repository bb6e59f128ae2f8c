"""Where to compute and in which precision: one decision for `mtx train` and `mtx translate`.

Half precision means bf16 on GPUs that compute it natively (Ampere and later) and fp16 on older ones (V100,
T4), which only emulate bf16, slowly. Training runs half precision as autocast over float32 weights, with a
gradient scaler for fp16; translation stores the weights themselves in half precision (`half_precision_model`)
but keeps the numerically sensitive parts in float32: LayerNorm's statistics, the positional table and the
final log-softmax.
"""

from __future__ import annotations

import os
from typing import Literal

import torch
from torch import nn

from mtx.errors import MtxError

DeviceName = Literal["auto", "cpu", "cuda"]


def choose_device(requested: str, flag: str, index: int = 0) -> torch.device:
    """`auto` is the GPU when PyTorch sees one; `cuda` without one is a user error naming `flag`."""
    available = torch.cuda.is_available()
    if requested == "cuda" and not available:
        raise MtxError(f"{flag} = 'cuda' but PyTorch sees no CUDA GPU here: use auto or cpu, or run on a machine "
                       "with a GPU and a CUDA build of PyTorch.")
    if requested == "cuda" or (requested == "auto" and available):
        return torch.device("cuda", index)
    return torch.device("cpu")


def available_memory(device: torch.device) -> int:
    """Bytes that new tensors on `device` can still take: the GPU's free memory plus what PyTorch's allocator
    holds unused, or the host's available memory (MemAvailable on Linux, free pages elsewhere)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def native_bf16(device: torch.device) -> bool:
    """Whether `device` computes bf16 in hardware: every CPU PyTorch runs on does (or emulates it exactly and
    fast enough for tests), GPUs from Ampere on; `is_bf16_supported()` alone also says yes where it is emulated."""
    return device.type == "cpu" or torch.cuda.is_bf16_supported(including_emulation=False)


def half_dtype(device: torch.device) -> torch.dtype:
    """The half precision `auto` chooses on a GPU: bf16 where it is native, fp16 otherwise."""
    return torch.bfloat16 if native_bf16(device) else torch.float16


def check_bf16(device: torch.device, flag: str) -> None:
    if not native_bf16(device):
        raise MtxError(f"{flag} asks for bf16, but {torch.cuda.get_device_name(device)} only emulates it (slowly): "
                       "use fp16 or auto, which picks fp16 on this GPU.")


def choose_dtype(requested: str, device: torch.device, flag: str) -> torch.dtype:
    """The floating-point format of `train.precision` or `--dtype` (`flag`, named in errors): `auto` is
    float32 on a CPU and half precision on a GPU. Training autocasts to it (float32: no autocast)."""
    if requested == "auto":
        return torch.float32 if device.type == "cpu" else half_dtype(device)
    if requested == "bf16":
        check_bf16(device, flag)
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[requested]


def allow_tf32(device: torch.device) -> bool:
    """Let float32 matrix products on `device` use TF32 where the GPU has it (Ampere and later), as
    `torch.set_float32_matmul_precision("high")` does: a float32 training run (`train.precision: fp32`) then
    multiplies at several times float32's speed, with a 10-bit mantissa in the products and float32 sums.
    PyTorch leaves it off by default for exact float32 results, which training does not need: it already runs
    in bf16 wherever `auto` chooses. A CPU has no TF32: nothing changes there. Returns whether TF32 is allowed."""
    if device.type != "cuda":
        return False
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return True


def half_precision_model(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """`model` with its weights in `dtype`, except LayerNorm's and the positional table, which stay float32.

    The LayerNorms compute in float32 whatever their input (mtx.model.transformer.LayerNorm), so their statistics over
    d_model values do not lose half precision's bits; a positional encoding of a late position differs from
    its neighbours' in the low bits, which bf16's 8-bit mantissa would round away.
    """
    model.to(dtype)
    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            module.float()
    for name, buffer in model.named_buffers(recurse=False):
        setattr(model, name, buffer.float())
    return model
