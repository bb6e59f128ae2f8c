"""Scoring: sacreBLEU's BLEU, chrF and TER, and the paper's tokenized BLEU."""
