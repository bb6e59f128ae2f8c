"""The model: the Transformer of "Attention Is All You Need", the CPU fast paths it calls, its int8 form.

Its modules:

    transformer   the paper's model, top to bottom, with the inference API that search drives
    decoder_state the decoder's cache between steps, which search grows, reorders and drops
    fast_paths    the same computations arranged to run faster on a CPU (dropout, attention, projection)
    int8          every linear layer's product in 8-bit integers, each input row quantised on its own
"""
