"""Looking inside a model: what its attention heads see, and how well its attention aligns words.

Its modules:

    inspection           one sentence translated, and every layer's and head's attention over the pair
    head_stats           per-head statistics: entropy, and the shares on the previous, same and boundary tokens
    attention_terminal   the heatmaps and statistics table in a terminal (rich)
    attention_page       the same as one self-contained HTML page
    command              `mtx inspect`
    aer                  alignment error rate against gold alignments (Och & Ney), for bench/alignment.py
"""
