"""Settings and fixtures shared by the whole suite."""

from pathlib import Path

import pytest
from hypothesis import settings
from support import copy_lexicon, copy_task

# Property tests draw the same examples on every run and machine: a failure is reproduced by running the test
# again, and a pass never depends on luck. No example database either, so nothing is written into the
# repository and one run's failures do not steer the next. No deadline: on a busy shared CPU an example's time
# says nothing about the code, and a deadline would fail at random.
settings.register_profile("mtx", derandomize=True, database=None, deadline=None)
settings.load_profile("mtx")


@pytest.fixture(scope="session")
def copy_model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The copy-task model (support.copy_task) as a checkpoint whose recipe decodes with beam 4, and 40 held-out
    sentences, in a file too: what `mtx serve`'s tests (test_serve, test_serve_fuzz) serve, trained once."""
    from mtx.checkpoint import make_checkpoint, save_checkpoint

    model, tokenizer, held_out = copy_task(40)
    folder: Path = tmp_path_factory.mktemp("serve")
    checkpoint = folder / "copy.pt"
    decode = {"beam": 4, "lenpen": 0.6, "max_len_a": 1.0, "max_len_b": 5}
    save_checkpoint(make_checkpoint(model, tokenizer.to_str(), {"decode": decode}, 250), checkpoint)
    (folder / "held_out.txt").write_text("".join(f"{s}\n" for s in held_out), encoding="utf-8")
    return dict(checkpoint=checkpoint, held_out=held_out, input=folder / "held_out.txt")


@pytest.fixture(scope="session")
def listed_copy_model(copy_model: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """copy_model's checkpoint carrying a lexical table (width 10) of its held-out sentences copied, each token its
    own translation: one that admits shortlists (mtx serve's tests)."""
    import torch

    from mtx.checkpoint import save_checkpoint
    from mtx.tokenizer import Tokenizer

    stored = torch.load(copy_model["checkpoint"], weights_only=True)
    tokenizer = Tokenizer.from_str(stored["tokenizer"])
    lexicon = copy_lexicon(tokenizer, tokenizer.vocab_size, copy_model["held_out"])
    checkpoint = tmp_path_factory.mktemp("listed") / "copy-lexicon.pt"
    save_checkpoint({**stored, "lexicon": lexicon.to_checkpoint()}, checkpoint)
    return checkpoint


@pytest.fixture(scope="module")
def copying(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The copy-task model (support.copy_task) as a checkpoint whose recipe decodes with beam 4 and α 0.6, and 30
    held-out sentences in a file: one per test module that asks for it (test_decoding_options, test_edges)."""
    from mtx.checkpoint import make_checkpoint, save_checkpoint

    model, tokenizer, held_out = copy_task(30)
    folder = tmp_path_factory.mktemp("options")
    checkpoint = folder / "copy.pt"
    save_checkpoint(make_checkpoint(model, tokenizer.to_str(), {"decode": {"beam": 4, "lenpen": 0.6}}, 250),
                    checkpoint)
    source = folder / "source.txt"
    source.write_text("".join(f"{s}\n" for s in held_out), encoding="utf-8")
    return dict(model=model, tokenizer=tokenizer, held_out=held_out, folder=folder, checkpoint=checkpoint,
                source=source)
