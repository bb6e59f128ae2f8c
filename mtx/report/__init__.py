"""Reports of training runs (`mtx report`), from the files the runs leave behind:

Its modules:

    run_folder   a run's folder read: metrics.jsonl, data manifest, latest checkpoint, score cards
    summary      what the report says about runs: summary row, time to BLEU, recipe differences
    terminal     the summary table and sparklines, with rich (mtx's own dependencies)
    charts       the learning curves as SVG, with matplotlib (the optional extra mtx[report])
    page         the self-contained HTML page that holds it all
    command      `mtx report`
"""
