"""Two gloo ranks at the end of training: rank 0 chooses α on the valid split (train.tune_lenpen) while rank 1
waits for it at the final barrier, and both return."""

from pathlib import Path

import pytest
import torch
from support import NO_DROPOUT, join_group, prepared, recipe, run_ranks

from mtx.checkpoint import load_checkpoint
from mtx.train.components import build_run
from mtx.train.trainer import Trainer, distributed

pytestmark = pytest.mark.dist


def tuning_worker(rank: int, world: int, port: int, recipe_path: str, out: str) -> None:
    ctx = join_group(rank, world, port)
    try:
        run = recipe(Path(recipe_path), NO_DROPOUT, "decode.beam=2", max_steps=4, save_every=100)
        state = Trainer(build_run(run, ctx)).fit()
        Path(out, f"rank{rank}").write_text(str(state.step))
    finally:
        distributed.teardown()


def test_rank_0_chooses_alpha_while_the_others_wait(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    path = prepared(tmp_path)
    run_ranks(tuning_worker, str(path), str(tmp_path))
    assert [(tmp_path / f"rank{rank}").read_text() for rank in range(2)] == ["4", "4"]
    last = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert last["recipe"]["decode"]["lenpen"] == last["lenpen_choice"]["chosen"]
