"""`mtx serve`: translation over HTTP, with the sentences of concurrent requests decoded in shared batches.

    batcher      the bounded queue and its decoding workers: dynamic batching, refusal when full, the drain
    service      the model loaded and warmed up; each request's checks (options, limits), queueing and answer
    worker       a decoding process with its own copy of the model, restarted if it dies
    metrics      counters and histograms for GET /metrics, in Prometheus' text format
    events       the log: one JSON line per request and per event
    app          the HTTP interface on FastAPI (the optional extra mtx[serve]): routes, errors, the request log
    command      `mtx serve`: flags, the listening socket, uvicorn, SIGTERM's drain
"""
