"""One decision of device and precision for training and translation, and half precision that keeps
LayerNorm and the positional table in float32."""

import pytest
import torch
from support import tiny_model

from mtx.devices import choose_device, choose_dtype, half_precision_model
from mtx.errors import MtxError
from mtx.model.transformer import LayerNorm

CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)


@pytest.fixture
def gpu(monkeypatch):
    """A GPU as far as the decision is concerned: native bf16 or only emulated (V100, T4), as set."""
    kind = {"native_bf16": True}

    def is_bf16_supported(including_emulation: bool = True) -> bool:
        return including_emulation or kind["native_bf16"]

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-32GB")
    return kind


def test_auto_is_float32_on_a_cpu_for_both_commands() -> None:
    assert choose_dtype("auto", CPU, "train.precision") == choose_dtype("auto", CPU, "--dtype") == torch.float32
    assert choose_dtype("bf16", CPU, "train.precision") == choose_dtype("bf16", CPU, "--dtype") == torch.bfloat16


@pytest.mark.parametrize(("native", "half"), [(True, torch.bfloat16), (False, torch.float16)])
def test_auto_on_a_gpu_is_the_same_half_precision_for_both_commands(gpu, native: bool, half: torch.dtype) -> None:
    """bf16 where the GPU computes it natively; fp16 where bf16 is only emulated, for training and translation
    alike (translation used to take emulated bf16)."""
    gpu["native_bf16"] = native
    assert choose_dtype("auto", GPU, "train.precision") == choose_dtype("auto", GPU, "--dtype") == half


def test_bf16_asked_for_on_a_gpu_that_emulates_it_is_refused_by_both(gpu) -> None:
    gpu["native_bf16"] = False
    with pytest.raises(MtxError, match=r"train.precision asks for bf16, but Tesla V100.* use fp16 or auto"):
        choose_dtype("bf16", GPU, "train.precision")
    with pytest.raises(MtxError, match=r"--dtype asks for bf16, but Tesla V100"):
        choose_dtype("bf16", GPU, "--dtype")
    assert choose_dtype("fp16", GPU, "train.precision") == choose_dtype("fp16", GPU, "--dtype") == torch.float16


def test_cuda_without_a_gpu_names_the_flag(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(MtxError, match=r"--device = 'cuda' but PyTorch sees no CUDA GPU"):
        choose_device("cuda", "--device")
    assert choose_device("auto", "--device") == CPU


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_model_keeps_the_sensitive_parts_in_float32(dtype: torch.dtype) -> None:
    model = half_precision_model(tiny_model(), dtype)
    assert model.positions.dtype == torch.float32
    for module in model.modules():
        if isinstance(module, torch.nn.Linear | torch.nn.Embedding):
            assert module.weight.dtype == dtype
        if isinstance(module, torch.nn.LayerNorm):
            assert isinstance(module, LayerNorm) and module.weight.dtype == torch.float32
    x = torch.randn(2, 3, model.cfg.d_model).to(dtype)
    norm = model.decoder_layers[0].ffn_residual.norm
    out = norm(x)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), torch.nn.functional.layer_norm(x.float(), (model.cfg.d_model,)),
                               atol=1e-2, rtol=0)


def test_a_model_cast_whole_to_half_precision_still_runs() -> None:
    """`model.to(torch.bfloat16)` by hand (LayerNorm weights cast too) still computes LayerNorm in float32."""
    model = tiny_model().to(torch.bfloat16)
    src = torch.randint(4, 50, (2, 5))
    logits = model.output_logits(model(src, src == 0, src))
    assert logits.dtype == torch.bfloat16 and bool(logits.isfinite().all())
