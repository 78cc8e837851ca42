"""An OpenAI-compatible HTTP endpoint over the loaded models, from the notebook's own
process (``wb.serve()``, ``%wb serve``; docs/serving.md).

Modules: runner (serve(), the Server handle, uvicorn on a thread), app (Starlette app, API
key, counts), routes (the OpenAI routes over wb.stream / wb.chat_stream / wb.embed_batch),
openai_request / openai_response (the shapes), fanout (n choices as one stream; a client
that goes away cancels), body (bounded, strict JSON), http_errors (OpenAI's error object and
statuses), metrics (Prometheus text).
"""

from .runner import Server, running, serve, stop_all

__all__ = ["Server", "running", "serve", "stop_all"]
