"""The model: the Transformer of "Attention Is All You Need", and the CPU fast paths it calls.

    transformer   the paper's model, top to bottom, with the inference API that search drives
    fast_paths    the same computations arranged to run faster on a CPU (dropout, attention, projection)
"""
