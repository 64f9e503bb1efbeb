"""``python -m benchmarks.bare_service``: the floor of a Python HTTP path, for issue 13.

The service as ``python -m service`` starts it (settings, uvicorn and its protocol, the models,
the queues and their worker threads), except that ``POST /v1/embeddings`` is answered by a
bare ASGI handler in front of the app: the body parsed with orjson, the texts tokenized,
submitted to the embedding queue, the vectors written with orjson. No validation, API key,
limits, metrics, request id, Server-Timing or disconnect handling: what the same engine and
queue reach over HTTP with nothing else in the way. A measuring instrument, not a way to
serve (every other path, and every error, goes to the app as usual).
"""

from __future__ import annotations

import sys
from typing import Any, cast

import orjson
from fastapi import FastAPI

from service.__main__ import prepare_process, serve
from service.engine.base import EmbedItem
from service.http.app import create_app
from service.settings import Settings

_JSON = (b"content-type", b"application/json")


class BareEmbeddings:
    """``POST /v1/embeddings`` on the embedding queue directly; everything else to ``app``."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.state = app.state  # serve() reads the runtime there

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/v1/embeddings":
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        given = orjson.loads(body)["input"]
        texts = given if isinstance(given, list) else [given]
        model = self.state.runtime.embedding_model
        encodings = model.engine.encode(texts)
        items = [EmbedItem(t, True, e, True) for t, e in zip(texts, encodings, strict=True)]
        timeout_s = self.state.runtime.settings.request_timeout_s
        results = await model.queue.submit(items, timeout_s, [e.n_tokens for e in encodings])
        data = [{"object": "embedding", "index": i, "embedding": r.vector} for i, r in enumerate(results)]
        usage = {"total_tokens": sum(e.n_tokens for e in encodings)}
        name = model.engine.manifest.name
        answer = orjson.dumps(
            {"object": "list", "data": data, "model": name, "usage": usage}, option=orjson.OPT_SERIALIZE_NUMPY
        )
        headers = [_JSON, (b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


def main() -> int:
    settings = Settings()
    prepare_process(settings)
    return serve(cast(FastAPI, BareEmbeddings(create_app(settings))), settings)


if __name__ == "__main__":
    sys.exit(main())
