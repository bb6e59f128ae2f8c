"""Where a resumed session continues: the position in the epoch under this session's shape, and what it says."""

from mtx.train.state import TrainState, reposition_for_this_session


def repositioned(state: TrainState, batches: int, max_tokens: int, world: int, update_freq: int
                 ) -> tuple[TrainState, list[str]]:
    said: list[str] = []
    reposition_for_this_session(state, batches, max_tokens, world, update_freq, said.append)
    return state, said


def test_the_same_shape_continues_at_the_same_batch_and_says_nothing() -> None:
    state, said = repositioned(TrainState(batch_in_epoch=6, world=2, update_freq=1, max_tokens=160,
                                          epoch_batches=40), 40, 160, 2, 1)
    assert (state.batch_in_epoch, state.world, state.update_freq, state.epoch_batches) == (6, 2, 1, 40)
    assert said == []


def test_another_shape_continues_at_the_same_batch_and_says_whether_the_update_changed() -> None:
    state, said = repositioned(TrainState(batch_in_epoch=6, world=1, update_freq=2, max_tokens=160,
                                          epoch_batches=40), 40, 160, 2, 1)
    assert (state.batch_in_epoch, state.world, state.update_freq) == (6, 2, 1)
    assert said == ["Resuming on 2 processes × update_freq 1 where the run stopped on 1 × 2: it continues at batch 6 "
                    "of epoch 1. An update has the same 2 batches as before."]
    _, said = repositioned(TrainState(batch_in_epoch=6, world=1, update_freq=2), 40, 160, 1, 1)
    assert "The effective batch changes from 2 to 1 batches" in said[0]


def test_another_max_tokens_continues_at_the_same_fraction_of_the_epoch() -> None:
    state, said = repositioned(TrainState(epoch=3, batch_in_epoch=10, max_tokens=160, epoch_batches=40), 80, 80, 1, 1)
    assert (state.batch_in_epoch, state.max_tokens, state.epoch_batches) == (20, 80, 80)
    assert said == ["The batches were cut with max_tokens 160 when the run stopped and are cut with 80 now: it "
                    "continues at the same fraction of epoch 3, batch 20 of 80 (it stopped at 10 of 40)."]


def test_a_state_from_before_shapes_were_recorded_takes_this_sessions() -> None:
    """No max_tokens or epoch_batches recorded (an older mtx): the position stands, the shape is recorded."""
    state, said = repositioned(TrainState(batch_in_epoch=5), 30, 160, 1, 1)
    assert (state.batch_in_epoch, state.max_tokens, state.epoch_batches) == (5, 160, 30) and said == []


def test_a_state_from_before_best_metric_takes_its_best_bleu_as_the_best_score_by_bleu() -> None:
    """A checkpoint whose progress has best_bleu but no best_score (best.pt was then judged by BLEU alone): a run
    judged by BLEU goes on from that best, one judged by nll starts its own; a recorded best_score stands."""
    old = {"step": 8, "best_bleu": 21.5, "bad_validations": 1}
    assert TrainState.from_progress(old, 1, 1, best_metric="bleu").best_score == 21.5
    assert TrainState.from_progress(old, 1, 1, best_metric="nll").best_score is None
    new = {**old, "best_score": 2.25}
    assert TrainState.from_progress(new, 1, 1, best_metric="bleu").best_score == 2.25
