"""Scoring: sacreBLEU's BLEU, chrF and TER, and the paper's tokenized BLEU.

Its modules:

    metrics      sacreBLEU's metrics, corpus and sentence level, and paired bootstrap significance
    paper_bleu   the paper's tokenized BLEU (Moses tokenization, compounds split as ##AT##)
    command      `mtx score`
"""
