"""`mtx serve`: translation over HTTP, with the sentences of concurrent requests decoded in shared batches.

    batcher      the bounded queue and its feeding threads: dynamic batching, refusal when full, the drain
    service      each request's checks (options, the model's limits read without its weights), queueing, answer
    decoding_process  a process with its own copy of the model that decodes batches, restarted if it dies
    metrics      counters and histograms for GET /metrics, in Prometheus' text format
    events       the log: one JSON line per request and per event
    app          the HTTP interface on FastAPI (the optional extra mtx[serve]): routes, errors, the request log
    command      `mtx serve`: flags, the listening socket, uvicorn, SIGTERM's drain
"""
