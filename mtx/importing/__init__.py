"""Starting from a published model: `mtx import` makes an mtx checkpoint of a MarianMT model (OPUS-MT, Tatoeba-MT).

Its modules:

    source      a folder or a Hugging Face hub id → the local folder of its files (the hub's cache, as transformers
                keeps it)
    marian      MarianConfig → ModelConfig, refusing by name what mtx cannot hold exactly; Marian's weights → an
                mtx model in mtx's ids; the stored recipe (model, languages, decoding)
    command     `mtx import`
"""
