"""OpenAI-compatible generation on the built-in engine: `/v1/models`, `/v1/completions` and
`/v1/chat/completions` with SGLang's field names, defaults and error shape (user docs:
docs/openai-api.md).

* `protocol`: a request body, validated, as the engine requests (`Req`) it runs (a `Plan`);
  anything wrong is an `APIError` (HTTP 400 naming the field) before anything is generated.
* `responses`: finished requests as the non-streaming answer (choices, log-probs, usage).
* `stream`: the server-sent events of `stream: true`, token by token as the scheduler decodes.

The requests go to the same scheduler as `/generate` (one queue, one batch, the same limits);
`slime.engine.routes.openai` serves the routes.
"""
