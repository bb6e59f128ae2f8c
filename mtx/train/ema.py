"""An exponential moving average of the weights (`train.ema_decay`): the model that validation, best.pt and
translation use when a run keeps one.

After every update each weight's average moves toward the weight: ema ← d · ema + (1 − d) · θ. The average of
the weights along the end of training sits nearer the middle of the basin the optimizer bounces around in than
any one point of it, as checkpoint averaging (§6.1) does with a handful of points; fairseq, OpenNMT-py and
Marian keep one. The decay of update t is min(ema_decay, (1 + t) / (10 + t)) (TensorFlow's
ExponentialMovingAverage with num_updates): at 0.9999 an average would otherwise remember the random
initialisation for tens of thousands of updates, which a short or fine-tuning run never reaches.

The average is kept in float32 beside the weights, on their device, and is a pure function of the weights
after each update and the step: every rank, holding the same weights after DDP's all-reduce, keeps the same
average without communicating, and a resumed run continues it exactly from its checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from mtx.model.transformer import Transformer


def decay_at(decay: float, step: int) -> float:
    """The decay of update `step` (from 1): `decay`, or less while the run is young."""
    return min(decay, (1 + step) / (10 + step))


class WeightAverage:
    """The moving average of `model`'s parameters; its buffers (the positional table) are the model's own."""

    def __init__(self, model: Transformer, decay: float) -> None:
        self.model, self.decay = model, decay
        self.parameters = list(model.parameters())  # each shared parameter once (the tied embedding)
        with torch.no_grad():
            self.averages = [p.detach().float().clone() for p in self.parameters]

    @torch.no_grad()
    def update(self, step: int) -> None:
        """Move the average toward the weights of update `step`: one fused kernel for all parameters."""
        weights = [p.detach() if p.dtype == torch.float32 else p.detach().float() for p in self.parameters]
        torch._foreach_lerp_(self.averages, weights, 1.0 - decay_at(self.decay, step))

    @torch.no_grad()
    def restart_from_weights(self) -> None:
        """Start the average over at the weights as they are (a run resumed with train.ema_decay newly set)."""
        for average, parameter in zip(self.averages, self.parameters, strict=True):
            average.copy_(parameter)

    def state_dict(self) -> dict[str, Tensor]:
        """The average as a state dict of the model: it loads wherever the model's does, and names that share
        one parameter share one tensor, as in the model's."""
        index = {id(p): i for i, p in enumerate(self.parameters)}
        averaged = {name: self.averages[index[id(p)]]
                    for name, p in self.model.named_parameters(remove_duplicate=False)}
        return {name: averaged.get(name, tensor) for name, tensor in self.model.state_dict().items()}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        index = {id(p): i for i, p in enumerate(self.parameters)}
        for name, parameter in self.model.named_parameters():
            self.averages[index[id(parameter)]].copy_(state[name])

    @contextmanager
    def in_model(self) -> Iterator[None]:
        """The average in the model's parameters for the time of the block, the weights put back after it (an
        interrupted validation too)."""
        with torch.no_grad():
            weights = [p.detach().clone() for p in self.parameters]
            for parameter, average in zip(self.parameters, self.averages, strict=True):
                parameter.copy_(average)
        try:
            yield
        finally:
            with torch.no_grad():
                for parameter, weight in zip(self.parameters, weights, strict=True):
                    parameter.copy_(weight)
