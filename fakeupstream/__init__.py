"""A fake OpenAI-compatible upstream: a pure ASGI app (stdlib only, no Django).

It reproduces, byte for byte, the streaming wire formats documented by three
providers, including their quirks and faults:

* ``i14``: JSON with Python's default ``json.dumps`` separators, reasoning in
  ``delta.reasoning_content``, a finish chunk with ``"usage": null``, then a
  usage-only chunk with ``"choices": []`` and ``x_i14_perf``; ``max_tokens``
  defaults to 100 (thinking counts towards it).
* ``api14``: compact JSON, no ``created``, no ``finish_reason`` key on
  non-final chunks, ``: api14 PROCESSING`` comment lines, reasoning in
  ``delta.reasoning``, usage with ``cost`` (USD) always on the finish chunk and
  mid-stream errors as a chunk with ``error`` and ``finish_reason: "error"``.
* ``infyrence``: compact JSON, an opening ``{"role":"assistant","content":""}``
  chunk, usage only with ``stream_options.include_usage``, ``X-Request-Id`` on
  every response, mid-stream errors as ``data: {"error": ...}`` followed by
  ``[DONE]``.

Routes (any path prefix is accepted, so the app can be mounted anywhere)::

    GET  .../(i14|api14|infyrence)/v1/models
    POST .../(i14|api14|infyrence)/v1/chat/completions
    POST .../(i14|api14|infyrence)/v1/embeddings

api14 and infyrence each list an embedding model (``"type": "embedding"``), answered in
OpenAI's form (``fakeupstream.embeddings``; no seed document gives a dialect's own).

The scenario is chosen by ``[[name]]`` / ``[[name:value]]`` directives in the
last user message: echo, chunks:N, size:N, reasoning:N, delay:MS, wait:MS,
fault:cut|eof|midstream|malformed|stall, malformed:N, status:CODE, html, echoauth, tools,
length, comment, cookie, stamp, shape:paragraph|code, nul (see ``fakeupstream.directives``).

Every chat/completions request is recorded as a ``StreamRecord`` whose
``threading.Event`` attributes let tests running in another thread wait for the
fake without sleeping. The log keeps the last ``max_records`` requests.

Served as the demo upstream (in the server's own process), ``caps`` bounds the
numeric directives (``DEMO_CAPS``) so one message cannot freeze the process, and
``keep_bytes=False`` keeps the log small.

The app and its routes are in ``app``; the dialects' models, ids and error bodies in
``dialects``, their chunks in ``chunks``; the directives in ``directives``, the answer
they make in ``plan`` from the canned ``texts``, sent by ``answers`` and ``replies``;
the request log in ``records``; embeddings in ``embeddings``.
"""
