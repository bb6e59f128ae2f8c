"""Decoding: checkpoints and sentences in, translations out.

    search       greedy and beam search over the `IncrementalDecoder` protocol, with a length penalty
    translator   `Translator`: sentences in, n-best lists out, batched by length, on CPU threads or a GPU
    ensemble     several models searched as one, their next-token probabilities averaged
    alignment    word alignments from one decoder layer's cross-attention
    command      `mtx translate`: a stream of lines in, one translation per line out
"""
