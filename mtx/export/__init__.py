"""Serving an mtx model with another runtime: `mtx export` writes a checkpoint as a folder for another runtime.

Its modules:

    hf             Hugging Face transformers: a MarianMT folder
    marian         the weights mapped onto MarianMT's names and shapes
    ctranslate2    a CTranslate2 model directory, quantized if asked
    tokenizer      mtx's tokenizer in the form each runtime reads
    model_card     the folder's README: what the model is and how to load it
    folder         an export written whole or not at all
    command        `mtx export`
"""
