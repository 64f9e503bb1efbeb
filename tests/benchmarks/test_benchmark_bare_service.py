"""The floor's bare handler (benchmarks/bare_service.py) does the route's work on the same queue
and engine, and leaves every other request to the app."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from benchmarks.bare_service import BareEmbeddings
from tests.service.api.conftest import serving

pytestmark = pytest.mark.anyio


async def test_the_bare_handler_answers_what_the_route_answers() -> None:
    async with serving() as s:
        bare = BareEmbeddings(s.app)
        transport = httpx.ASGITransport(app=bare)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            texts = ["a short one", "and another text"]
            routed = await s.client.post("/v1/embeddings", json={"input": texts})
            batches = len(s.embedder.hooks.batches)
            answered = await client.post("/v1/embeddings", json={"input": texts})
            assert routed.status_code == answered.status_code == 200
            assert len(s.embedder.hooks.batches) > batches  # through the engine's queue
            for a, b in zip(routed.json()["data"], answered.json()["data"], strict=True):
                assert a["index"] == b["index"]
                np.testing.assert_allclose(a["embedding"], b["embedding"], rtol=1e-6)
            one = await client.post("/v1/embeddings", json={"input": texts[0]})
            assert len(one.json()["data"]) == 1
            # everything else is the app's, errors included
            assert (await client.get("/health/ready")).status_code == 200
            assert (await client.post("/v1/embed", json={"texts": texts})).status_code == 200
            assert (await client.post("/v1/embed", json={"texts": []})).status_code == 422
