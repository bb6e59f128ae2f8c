"""Two gloo processes train exactly as one process accumulating two micro-batches per update."""

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from copy_task import prepared, recipe

from mtx import distributed
from mtx.train import Trainer

pytestmark = pytest.mark.dist

SETTINGS = dict(max_steps=6, validate_every=3, log_every=2, save_every=100)
NO_DROPOUT = "model.dropout=0.0"  # dropout masks differ by rank by design; without dropout the runs must agree


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_worker(rank: int, world: int, port: int, recipe_path: str, out: str) -> None:
    """What torchrun would start: the environment it sets, then the trainer; each rank saves its weights."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    ctx = distributed.setup("cpu")
    try:
        trainer = Trainer(recipe(Path(recipe_path), NO_DROPOUT, update_freq=1, **SETTINGS), ctx)
        trainer.fit()
        torch.save(trainer.model.state_dict(), Path(out) / f"rank{rank}.pt")
    finally:
        distributed.teardown()


def test_two_processes_equal_one_with_update_freq_two(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    one, two = prepared(tmp_path / "one"), prepared(tmp_path / "two")
    single = Trainer(recipe(one, NO_DROPOUT, update_freq=2, **SETTINGS), distributed.setup("cpu"))
    single.fit()

    mp.spawn(rank_worker, args=(2, free_port(), str(two), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for name, expected in single.model.state_dict().items():
        torch.testing.assert_close(ranks[0][name], expected, atol=1e-5, rtol=0, msg=name)
        assert torch.equal(ranks[0][name], ranks[1][name]), f"{name} differs between ranks"

    def logged(path: Path) -> list[dict]:
        rows = [json.loads(line) for line in (path.parent / "run" / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in row.items() if k != "tokens_per_s"} for row in rows]

    single_log, multi_log = logged(one), logged(two)
    assert [(e["event"], e["step"]) for e in multi_log] == [(e["event"], e["step"]) for e in single_log]
    for a, b in zip(multi_log, single_log, strict=True):
        for key in ("loss", "nll", "grad_norm", "valid_loss", "valid_bleu"):
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), key
