"""Decoding: checkpoints and sentences in, translations out.

Its modules:

    engine         the one interface every translating command uses (`Engine`)
    engines        an engine chosen by name (--engine): opened, and a request checked against its capabilities
    torch_engine   the `torch` engine: mtx's own search, the reference, every option; batches side by side in workers
    workers        decoding processes started once, each with its own model, given calls; restarted if they die
    translation    what an engine takes and returns: token ids in, n-best `Translation`s and stats out
    facts          `ModelFacts`: what a checkpoint says of itself (tokenizer, limits, defaults, table, languages)
    request        `Request`: one call's options, whose fields make the flags and HTTP fields, its rules written once
    ct2_engine     the `ct2` engine: CTranslate2's translator over the converted checkpoint, mtx's numbers kept
    ct2_capabilities  what CTranslate2 does with each request field, or why it refuses it (no torch, no CTranslate2)
    ct2_folder     a checkpoint as a CTranslate2 folder (also `mtx export`'s), converted once and cached beside it

    search         greedy, beam and sampling search over the `IncrementalDecoder` protocol, with a length penalty,
                   target prefixes and no repeated n-grams
    sampling       the draws of sampling: counter-based random numbers per (seed, line, sample, step), and filters
    forced         forced scores: the model's score of given translations (--score-reference)
    limits         what a model allows a translation (vocabulary, positions, decoder layers, output length), read
                   from the models or from the checkpoints' metadata alone (the server's request checks)
    target_lang    which language a model of several target languages produces: the tag put before a source
    translator     `Translator`: mtx's search over one request in one process, batched by length
    lifetime       a decoding worker ends with the process that started it, even one killed with SIGKILL
    ensemble       several models searched as one, their next-token probabilities averaged
    shortlist      each sentence searched over its own few likely target tokens (--shortlist), from the lexicon
    alignment      word alignments from one decoder layer's cross-attention, carried through the search
    doubts         why a translation deserves a human look (jsonl's "flags"), by thresholds from the training data
    lenpen_choice  the length penalty's α chosen for a model on its valid split (mtx average --tune-lenpen)
    output         the output formats: text, n-best, jsonl
    shards         one shard of a file to translate (--shard K/N), and its output, resumable line by line
    command        `mtx translate`: a stream of lines in, one translation per line out
"""
