"""Invariants of the Transformer: sizes, incremental decoding, causality, padding."""

import copy

import pytest
import torch
import torch.nn.functional as F
from support import TINY_VOCAB, tiny_model

from mtx.config.recipe import ModelConfig, resolve_model
from mtx.decode.translator import prepare_model
from mtx.model.decoder_state import DecoderState
from mtx.model.transformer import (
    SequenceTooLongError,
    Transformer,
    count_parameters,
    count_parameters_for,
)


def batch(seed: int = 1, lengths: tuple[int, ...] = (7, 4, 9)) -> tuple[torch.Tensor, torch.Tensor]:
    """Random sources of the given lengths, right-padded with 0."""
    g = torch.Generator().manual_seed(seed)
    src = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(4, TINY_VOCAB, (n,), generator=g)
    return src, src == 0


@pytest.mark.parametrize(("preset", "expected"), [("base", 63_082_496), ("big", 214_245_376)])
def test_paper_parameter_counts(preset: str, expected: int) -> None:
    """Table 3 with a 37k shared vocabulary: base ≈ 63.1M (paper 65M), big ≈ 214.2M (paper 213M)."""
    count = count_parameters_for(resolve_model(ModelConfig(preset=preset)), 37_000)
    assert count == expected
    assert abs(count - {"base": 63.1e6, "big": 214.2e6}[preset]) / count < 0.002


def test_meta_count_equals_real_model() -> None:
    model = tiny_model(share=False)
    assert count_parameters(model) == count_parameters_for(model.cfg, TINY_VOCAB)


def test_untied_embeddings_add_a_source_matrix() -> None:
    assert count_parameters(tiny_model(share=False)) - count_parameters(tiny_model()) == TINY_VOCAB * 32


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_decode_step_reproduces_forward(norm: str) -> None:
    """Stepping the KV cache token by token gives the teacher-forced log-probabilities, padding included."""
    model = tiny_model(norm)
    src, src_pad = batch()
    tgt_in = torch.randint(4, TINY_VOCAB, (3, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = torch.log_softmax(model.output_logits(model(src, src_pad, tgt_in)), dim=-1)
        state = model.init_state(model.encode(src, src_pad), src_pad, max_len=10)
        steps = [model.decode_step(tgt_in[:, t], state)[0] for t in range(tgt_in.shape[1])]
    torch.testing.assert_close(torch.stack(steps, dim=1), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("beams", [1, 3])
def test_decode_step_after_reorder(beams: int) -> None:
    """Reordering the state mid-sequence is the same as having decoded the reordered batch from the start:
    sentences dropped and reordered (one row each), or rows moved among the beams of one sentence."""
    model = tiny_model()
    src, src_pad = batch() if beams == 1 else batch(lengths=(5,))
    tgt_in = torch.randint(4, TINY_VOCAB, (3, 6), generator=torch.Generator().manual_seed(3))
    idx = torch.tensor([2, 0]) if beams == 1 else torch.tensor([2, 0, 0])
    with torch.no_grad():
        state = model.init_state(model.encode(src, src_pad), src_pad, max_len=8)
        if beams > 1:
            state = state.reorder(torch.zeros(beams, dtype=torch.long))  # the sentence's row becomes its beams
        for t in range(3):
            model.decode_step(tgt_in[:, t], state)
        state = state.reorder(idx, idx if beams == 1 else None)
        got = [model.decode_step(tgt_in[idx, t], state)[0] for t in range(3, 6)]
        src, src_pad = (src, src_pad) if beams == 1 else (src.expand(3, -1), src_pad.expand(3, -1))
        expected = torch.log_softmax(model.output_logits(model(src[idx], src_pad[idx], tgt_in[idx])), dim=-1)[:, 3:]
    torch.testing.assert_close(torch.stack(got, dim=1), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("rows", "sentences", "message"), [
    ([0, 0, 1], None, "grouped evenly"),  # rows that do not group by sentence
    ([1, 1], [1, 1], "more than once"),  # a sentence's rows continue its own caches in place: it cannot be kept twice
])
def test_reorder_refuses_rows_that_do_not_fit_the_sentences(rows: list[int], sentences: list[int] | None,
                                                            message: str) -> None:
    model = tiny_model()
    src, src_pad = batch(lengths=(6, 3))
    with torch.no_grad():
        state = model.init_state(model.encode(src, src_pad), src_pad, max_len=4)
    with pytest.raises(ValueError, match=message):
        state.reorder(torch.tensor(rows), None if sentences is None else torch.tensor(sentences))


def test_forward_at_target_positions_gives_the_states_of_those_positions() -> None:
    """With the flat indices of the target positions (as Batch has them), forward returns the full pass's
    decoder states at those positions, in row-major order."""
    model = tiny_model()
    src, src_pad = batch()
    tgt_in = torch.randint(4, TINY_VOCAB, (3, 6), generator=torch.Generator().manual_seed(10))
    tgt_mask = torch.arange(6) < torch.tensor([[6], [2], [4]])
    with torch.no_grad():
        full = model(src, src_pad, tgt_in)
        gathered = model(src, src_pad, tgt_in, tgt_mask.flatten().nonzero().squeeze(1))
    assert gathered.shape == (12, 32)
    torch.testing.assert_close(gathered, full[tgt_mask], atol=1e-6, rtol=0)


def test_causality() -> None:
    """Changing a future target token never changes the outputs at earlier positions."""
    model = tiny_model()
    src, src_pad = batch()
    tgt_in = torch.randint(4, TINY_VOCAB, (3, 8), generator=torch.Generator().manual_seed(4))
    changed = tgt_in.clone()
    changed[:, 5:] = torch.randint(4, TINY_VOCAB, (3, 3), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        a, b = model(src, src_pad, tgt_in), model(src, src_pad, changed)
    torch.testing.assert_close(a[:, :5], b[:, :5], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, 5:], b[:, 5:])


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_source_padding_is_invisible(norm: str) -> None:
    """A sentence alone, padded, or batched with a longer one gives the same outputs."""
    model = tiny_model(norm)
    src, src_pad = batch(lengths=(4, 9))
    tgt_in = torch.randint(4, TINY_VOCAB, (2, 5), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        alone = model(src[:1, :4], None, tgt_in[:1])
        padded = model(torch.cat([src[:1, :4], torch.zeros(1, 6, dtype=torch.long)], 1),
                       torch.tensor([[False] * 4 + [True] * 6]), tgt_in[:1])
        batched = model(src, src_pad, tgt_in)[:1]
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=0)


def test_too_long_sequences_are_refused_clearly() -> None:
    model = tiny_model()
    with pytest.raises(SequenceTooLongError, match="max_positions"):
        model.encode(torch.ones(1, 65, dtype=torch.long), None)
    with pytest.raises(SequenceTooLongError, match="max_positions"):
        model(torch.ones(1, 3, dtype=torch.long), None, torch.ones(1, 65, dtype=torch.long))


def test_three_way_tying_shares_one_matrix() -> None:
    model = tiny_model()
    assert model.src_embed.weight is model.tgt_embed.weight
    names = [n for n, _ in model.named_parameters()]
    assert sum("embed" in n for n in names) == 1


def test_dropout_only_in_training() -> None:
    model = tiny_model()
    src, src_pad = batch()
    tgt_in = torch.randint(4, TINY_VOCAB, (3, 5), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        torch.testing.assert_close(model(src, src_pad, tgt_in), model(src, src_pad, tgt_in))
        model.train()
        assert not torch.allclose(model(src, src_pad, tgt_in), model(src, src_pad, tgt_in))


def test_repeated_reorders_grow_shrink_and_move_only_what_must_move() -> None:
    """Beam search reorders every step, expands the batch at the start and shrinks it as sentences finish.

    Every row is fed its own tokens, so a row that inherited the wrong parent's cache, or a sentence the wrong
    source, would show. After the grow, which gathers into a new buffer, every reorder works in that buffer:
    a step moves no cache but the second continuations of one (`slots` says where each row's cache is), and
    dropping a sentence moves only the sentences whose caches lie beyond the rows that are left.
    """
    model = tiny_model()
    src, src_pad = batch(lengths=(6, 3, 8))
    g = torch.Generator().manual_seed(8)
    states, caches = [], []
    with torch.no_grad():
        state = model.init_state(model.encode(src, src_pad), src_pad, max_len=9)
        history = torch.randint(4, TINY_VOCAB, (3, 1), generator=g)
        model.decode_step(history[:, 0], state)
        sentence = torch.tensor([0, 0, 1, 1, 2, 2])
        state, history = state.reorder(sentence), history[sentence]  # grow: two beams per sentence
        states.append(state)
        for idx, keep in (([1, 0, 3, 2, 4, 5], None), ([0, 0, 2, 3, 5, 5], None), ([2, 2, 4, 5], [1, 2]),
                          ([1, 0, 3, 3], None), ([2, 3], [1])):
            token = torch.randint(4, TINY_VOCAB, (len(sentence),), generator=g)
            model.decode_step(token, state)
            caches.append(state.self_kv[..., : state.step, :].clone())
            idx = torch.tensor(idx)
            state = state.reorder(idx, None if keep is None else torch.tensor(keep))
            states.append(state)
            history, sentence = torch.cat([history, token[:, None]], 1)[idx], sentence[idx]
        tail = torch.randint(4, TINY_VOCAB, (2, 3), generator=g)
        got = [model.decode_step(tail[:, t], state)[0] for t in range(3)]
        full = torch.cat([history, tail], 1)
        steps = full.shape[1] - tail.shape[1]
        expected = torch.log_softmax(model.output_logits(model(src[sentence], src_pad[sentence], full)), dim=-1)
    torch.testing.assert_close(torch.stack(got, dim=1), expected[:, steps:], atol=1e-5, rtol=0)
    assert sentence.tolist() == [2, 2]

    def buffer(t: torch.Tensor) -> int:
        return t.untyped_storage().data_ptr()

    grown = states[0]
    assert grown.slots is None  # a gather leaves each row's cache at its own row
    assert all(buffer(s.self_kv) == buffer(grown.self_kv) for s in states[1:])
    assert states[1].slots.tolist() == [1, 0, 3, 2, 4, 5]  # a permutation: every cache stays where it was
    assert torch.equal(caches[1][..., : caches[0].shape[4], :], caches[0])
    # [0, 0, 2, 3, 5, 5] where the permutation left the rows: the second continuations of caches 1 and 5 are
    # copied into the places of caches 0 and 4, which no row continues
    assert states[2].slots.tolist() == [1, 0, 3, 2, 5, 4]
    assert torch.equal(caches[2][:, :, 0, :, : caches[1].shape[4]], caches[1][:, :, 1])
    assert torch.equal(caches[2][:, :, 4, :, : caches[1].shape[4]], caches[1][:, :, 5])
    # sentence 0 complete, [2, 2, 4, 5] of rows at [1, 0, 3, 2, 5, 4]: sentence 1 stays in its rows (cache 3
    # continued in place, its second continuation copied into 2), sentence 2's caches 5 and 4 move into sentence
    # 0's rows 1 and 0, its source's cross-attention cache with them
    assert states[3].slots.tolist() == [3, 2, 1, 0]
    assert states[3].self_kv.shape[2] == 4 and states[3].cross_kv.shape[2] == 2


def test_int8_output_projection_multiplies_by_the_dequantized_matrix() -> None:
    """With the int8 output projection of `--dtype int8`, output_logits is h times the int8 matrix
    dequantized. int8 also rounds each row of h to an 8-bit grid, which represents 0 and the row's largest
    value exactly, so for states c · e_j the only difference from the dequantized product is float rounding,
    far below the int8 weights' own rounding that the float32 matrix would show."""
    torch.manual_seed(0)
    cfg = resolve_model(ModelConfig(preset="tiny", d_model=256, heads=4, d_ff=64, layers_enc=1, layers_dec=1,
                                    max_positions=64))
    fp32 = Transformer(cfg, 2560).eval()
    int8 = prepare_model(copy.deepcopy(fp32), torch.device("cpu"), "int8")
    assert int8.output_proj is not None
    dequantized = int8.output_proj.weight_t.t().float() * int8.output_proj.weight_scale
    h = torch.zeros(5, 1, 256)
    h[torch.arange(5), 0, torch.tensor([0, 7, 100, 255, 31])] = 1.0  # c = 1
    with torch.no_grad():
        got, exact = int8.output_logits(h), fp32.output_logits(h)
    torch.testing.assert_close(got, F.linear(h, dequantized), atol=1e-5, rtol=0)
    assert (got - exact).abs().max() > 1e-4  # the weights really are int8
    torch.testing.assert_close(got, exact, atol=0.01, rtol=0)  # and still the same matrix


def test_a_quantizable_output_projection_is_the_embedding_matrix_itself() -> None:
    """`make_output_projection_a_module` gives the projection an nn.Linear that shares the embedding's
    parameter (no copy) and computes the same logits, h · Eᵀ."""
    model = tiny_model()
    src, src_pad = batch()
    tgt_in = torch.randint(4, TINY_VOCAB, (3, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        states = model(src, src_pad, tgt_in)
        before = model.output_logits(states)
        model.make_output_projection_a_module()
        after = model.output_logits(states)
    assert model.output_proj.weight is model.tgt_embed.weight is model.output_weight
    assert model.output_proj.bias is None
    torch.testing.assert_close(after, before)
    torch.testing.assert_close(before, F.linear(states, model.tgt_embed.weight))


def test_state_bytes_are_what_a_search_s_decoder_state_holds() -> None:
    """The figure a search checks memory by (`state_bytes`) is the most its state holds at once: the rows'
    cache beside the one row a sentence that it grows from, and each sentence's cross-attention cache; no
    reorder after the grow allocates."""
    model = tiny_model()
    src, src_pad = batch(lengths=(7, 4, 9))
    beams, max_len = 4, 11

    def held(*states: DecoderState) -> int:
        tensors = {t.untyped_storage().data_ptr(): t for s in states for t in (s.self_kv, s.cross_kv)}
        return sum(t.untyped_storage().nbytes() for t in tensors.values())

    first = model.init_state(model.encode(src, src_pad), src_pad, max_len)
    grown = first.reorder(torch.arange(3).repeat_interleave(beams))  # each sentence grown into its beams
    assert held(first, grown) == model.state_bytes(3 * beams, 3, src.shape[1], max_len)
    moved = grown.reorder(torch.tensor([0, 0, 1, 2, 5, 4, 4, 7, 8, 9, 10, 11]))  # beams moved
    shrunk = moved.reorder(torch.arange(4, 12), torch.tensor([1, 2]))  # the first sentence complete
    assert held(grown, moved, shrunk) == held(grown)


def test_a_cpu_decoding_model_stores_its_weights_transposed_and_decodes_the_same() -> None:
    """prepare_model's fp32 on a CPU stores every weight transposed, the output projection's as a copy beside
    the embedding's (which lookups keep reading row-major), and decodes what the model as trained decodes: the
    same log-probabilities at every step, and the same beam search output."""
    from mtx.decode.search import Constraints, LengthPenalty, beam_search

    trained = tiny_model().eval()
    prepared = prepare_model(copy.deepcopy(trained), torch.device("cpu"), "fp32")
    linears = [m for m in prepared.modules() if isinstance(m, torch.nn.Linear)]
    assert prepared.output_proj in linears and all(m.weight.t().is_contiguous() for m in linears)
    assert prepared.tgt_embed.weight.is_contiguous()
    assert prepared.output_proj.weight.data_ptr() != prepared.tgt_embed.weight.data_ptr()
    src, src_pad = batch()
    with torch.no_grad():
        states = [m.init_state(m.encode(src, src_pad), src_pad, max_len=5) for m in (trained, prepared)]
        prev = torch.full((3,), 1)
        for _ in range(5):
            (a, states[0]), (b, states[1]) = trained.decode_step(prev, states[0]), prepared.decode_step(prev, states[1])
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
            prev = a.argmax(dim=-1)
    constraints, penalty = Constraints(torch.full((3,), 8)), LengthPenalty(0.6)
    searched = [beam_search(m, src, src_pad, constraints, penalty, beam=3) for m in (trained, prepared)]
    assert [[h.tokens for h in n] for n in searched[0]] == [[h.tokens for h in n] for n in searched[1]]
