"""`mtx serve`: translation over HTTP, with the sentences of concurrent requests decoded in shared batches.

Its modules:

    batcher      the bounded queue and its feeding threads: dynamic batching, refusal when full, the drain
    service      the engine, each request's checks (options, the model's facts, the engine's capabilities), answer
    metrics      counters and histograms for GET /metrics, in Prometheus' text format
    events       the log: one JSON line per request and per event
    app          the HTTP interface on FastAPI (the optional extra mtx[serve]): routes, errors, the request log
    command      `mtx serve`: flags, the listening socket, uvicorn, SIGTERM's drain
"""
