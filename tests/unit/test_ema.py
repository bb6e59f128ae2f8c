"""The moving average of the weights (train.ema_decay): its arithmetic, checkpoints, resume, and its users."""

import io
from pathlib import Path

import pytest
import torch
from support import prepared, recipe

from mtx.checkpoint import inference_weights, load_checkpoint, load_model, make_checkpoint, save_checkpoint
from mtx.config.fields import ConfigError
from mtx.config.loading import load_recipe
from mtx.config.model import ModelConfig, resolve_model
from mtx.errors import MtxError
from mtx.model.transformer import Transformer
from mtx.train.average import average_checkpoints
from mtx.train.ema import WeightAverage, decay_at
from mtx.train.trainer import train


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def tiny_model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    cfg = resolve_model(ModelConfig(preset="tiny", layers_enc=1, layers_dec=1, d_model=16, heads=2, d_ff=32,
                                    max_positions=16))
    return Transformer(cfg, 40)


def test_the_decay_is_small_while_the_run_is_young() -> None:
    assert decay_at(0.9999, 1) == pytest.approx(2 / 11)
    assert decay_at(0.9999, 90) == pytest.approx(91 / 100)
    assert decay_at(0.9, 1000) == 0.9


def test_the_average_follows_the_formula_and_shares_the_tied_matrix() -> None:
    model = tiny_model()
    ema = WeightAverage(model, decay=0.5)
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    history = []
    for step in (100, 101, 102):  # decay_at(0.5, step) = 0.5
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        history.append({name: p.detach().clone() for name, p in model.named_parameters()})
        ema.update(step)
    state = ema.state_dict()
    for name, first in start.items():
        expected = 0.125 * first + 0.125 * history[0][name] + 0.25 * history[1][name] + 0.5 * history[2][name]
        torch.testing.assert_close(state[name], expected, msg=name)
    tied = [name for name, p in model.state_dict().items() if p.data_ptr() == model.tgt_embed.weight.data_ptr()]
    assert len(tied) >= 2 and len({state[name].data_ptr() for name in tied}) == 1
    assert set(state) == set(model.state_dict())  # the positional table comes along: it loads as a model's


def test_in_model_puts_the_weights_back_even_after_an_error() -> None:
    model = tiny_model()
    ema = WeightAverage(model, decay=0.9)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(RuntimeError, match="interrupted"), ema.in_model():
        assert all(torch.equal(model.state_dict()[k], v) for k, v in ema.state_dict().items())
        raise RuntimeError("interrupted")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())


def test_a_run_with_ema_resumes_it_exactly_and_translates_with_it(tmp_path: Path, capfd) -> None:
    """20 updates straight = 9, stop, 11 more, for the average as for the weights; the step checkpoints hold
    both, best.pt the average alone; loading, averaging and translating take the average."""
    settings = dict(ema_decay=0.9, validate_every=10, save_every=5, keep_last=3)
    straight, resumed = prepared(tmp_path / "straight"), prepared(tmp_path / "resumed")
    train(recipe(straight, max_steps=20, **settings))
    train(recipe(resumed, max_steps=9, **settings))
    train(recipe(resumed, max_steps=20, **settings))
    a = load_checkpoint(load_recipe(straight).run_path / "checkpoints" / "last.pt")
    b = load_checkpoint(load_recipe(resumed).run_path / "checkpoints" / "last.pt")
    for key in ("model", "ema"):
        for name, tensor in a[key].items():
            torch.testing.assert_close(b[key][name], tensor, atol=1e-6, rtol=0, msg=f"{key} {name}")
    assert a["ema_decay"] == 0.9 and inference_weights(a) is a["ema"]
    low, high = a["data_stats"]["length_ratio"]  # the reverse-copy task: target as long as the source
    assert low == high == 1.0 and a["data_stats"]["copied"] == 1.0
    assert any(not torch.equal(a["ema"][k], a["model"][k]) for k in a["model"])

    checkpoints = load_recipe(straight).run_path / "checkpoints"
    best = load_checkpoint(checkpoints / "best.pt")
    assert "ema" not in best and best["ema_decay"] == 0.9 and "train_state" not in best
    model, _, _ = load_model(checkpoints / "last.pt")
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, a["ema"][name], msg=name)

    averaged = average_checkpoints([checkpoints / "step_15.pt", checkpoints / "step_20.pt"])
    step_15 = load_checkpoint(checkpoints / "step_15.pt")
    name = "tgt_embed.weight"
    torch.testing.assert_close(averaged["model"][name], (step_15["ema"][name] + a["ema"][name]) / 2)
    assert averaged["ema_decay"] == 0.9 and "ema" not in averaged

    from mtx.decode.command import translate_file

    source = tmp_path / "in.txt"
    source.write_text("ba ce di\n", encoding="utf-8")
    err = io.StringIO()
    translate_file([checkpoints / "best.pt"], source, tmp_path / "out.txt", options={}, batch_tokens=512,
                   device="cpu", dtype="fp32", threads=None, errors="strict", log=err.write)
    assert "EMA weights (decay 0.9)" in err.getvalue()


def test_ema_is_validated_and_averages_do_not_mix_with_raw_weights(tmp_path: Path) -> None:
    path = prepared(tmp_path)
    for bad in ("0", "1", "1.5", "-0.1"):
        with pytest.raises(ConfigError, match="train.ema_decay"):
            load_recipe(path, [f"train.ema_decay={bad}"])
    model = tiny_model()
    plain = make_checkpoint(model, "{}", {}, 1)
    with_ema = make_checkpoint(model, "{}", {}, 2, ema=WeightAverage(model, 0.9).state_dict(), ema_decay=0.9)
    save_checkpoint(plain, tmp_path / "plain.pt")
    save_checkpoint(with_ema, tmp_path / "ema.pt")
    with pytest.raises(MtxError, match="moving averages in one, raw weights in the other"):
        average_checkpoints([tmp_path / "plain.pt", tmp_path / "ema.pt"])


def test_turning_ema_on_in_a_resumed_run_starts_it_from_the_weights(tmp_path: Path, capfd) -> None:
    path = prepared(tmp_path)
    train(recipe(path, max_steps=4, save_every=2))
    train(recipe(path, max_steps=6, save_every=2, ema_decay=0.5))
    assert "holds no moving average: it starts from the weights of step 4" in " ".join(capfd.readouterr().err.split())
    assert "ema" in load_checkpoint(load_recipe(path).run_path / "checkpoints" / "last.pt")
