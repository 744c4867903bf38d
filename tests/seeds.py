"""Streams exactly as the providers' documents print them (../shared/seeds), for decoder and client tests."""
# ruff: noqa: E501  (the documents print these lines whole)

# i14 streaming guide: reasoning_content first, "usage": null on the finish chunk,
# then a usage-only chunk with "choices": [] and x_i14_perf.
I14_STREAM = (
    b'data: {"id": "req_5037a8cd7b5c48db8defd10bef0adb77", "object": "chat.completion.chunk", "created": 1791426846, "model": "i14-sugarglider-nemotron3-super-120B-v1", "choices": [{"index": 0, "delta": {"role": "assistant", "reasoning_content": "Ok"}, "finish_reason": null}]}\n\n'
    b'data: {"id": "req_5037a8cd7b5c48db8defd10bef0adb77", "object": "chat.completion.chunk", "created": 1791426846, "model": "i14-sugarglider-nemotron3-super-120B-v1", "choices": [{"index": 0, "delta": {"reasoning_content": "ay, t"}, "finish_reason": null}]}\n\n'
    b'data: {"id": "req_5037a8cd7b5c48db8defd10bef0adb77", "object": "chat.completion.chunk", "created": 1791426846, "model": "i14-sugarglider-nemotron3-super-120B-v1", "choices": [{"index": 0, "delta": {"content": "\\n\\n*"}, "finish_reason": null}]}\n\n'
    b'data: {"id": "req_5037a8cd7b5c48db8defd10bef0adb77", "object": "chat.completion.chunk", "created": 1791426846, "model": "i14-sugarglider-nemotron3-super-120B-v1", "choices": [{"index": 0, "delta": {"content": "*Ode"}, "finish_reason": null}]}\n\n'
    b'data: {"id": "req_5037a8cd7b5c48db8defd10bef0adb77", "object": "chat.completion.chunk", "created": 1791426846, "model": "i14-sugarglider-nemotron3-super-120B-v1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": null}\n\n'
    b'data: {"id": "req_5037a8cd7b5c48db8defd10bef0adb77", "object": "chat.completion.chunk", "created": 1791426846, "model": "i14-sugarglider-nemotron3-super-120B-v1", "choices": [], "usage": {"prompt_tokens": 45, "completion_tokens": 869, "total_tokens": 914, "completion_tokens_details": {"reasoning_tokens": 753}}, "x_i14_perf": {"tokens_per_second": 36.328, "generation_time_s": 23.9208, "time_to_first_token_s": 0.0957}}\n\n'
    b"data: [DONE]\n\n"
)

# api14 streaming (Hindi and French editions agree): compact JSON, no finish_reason key
# until the last chunk, which carries usage with cost in USD.
API14_STREAM = (
    b'data: {"id":"gen-1760000000-abc","object":"chat.completion.chunk","model":"openai/gpt-5-mini","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}\n\n'
    b'data: {"id":"gen-1760000000-abc","object":"chat.completion.chunk","model":"openai/gpt-5-mini","choices":[{"index":0,"delta":{"content":"lo!"}}]}\n\n'
    b'data: {"id":"gen-1760000000-abc","object":"chat.completion.chunk","model":"openai/gpt-5-mini","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13,"cost":0.0000085}}\n\n'
    b"data: [DONE]\n\n"
)

# api14 mid-stream error chunk, byte for byte as printed.
API14_ERROR_CHUNK = b'{ "error": { "code": 502, "message": "Provider disconnected" }, "choices": [{ "delta": { "content": "" }, "finish_reason": "error" }] }'

# infyrence mid-stream error event, then the [DONE] that is always sent.
INFYRENCE_ERROR_STREAM = (
    b'data: {"error":{"message":"...","type":"upstream_error","code":"upstream_unavailable"}}\n\ndata: [DONE]\n\n'
)
