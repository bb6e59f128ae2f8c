"""Serving an mtx model with another runtime: `mtx export` (command) writes a checkpoint as a folder for

    hf             Hugging Face transformers: a MarianMT folder (hf, with the weights mapped by marian)
    ctranslate2    a CTranslate2 model directory, quantized if asked

each with mtx's tokenizer (tokenizer), a model card (model_card), written whole or not at all (folder).
"""
