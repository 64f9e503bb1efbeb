"""Each sentence to translate is tokenized once per request: the route's encodings are the
queue's cost and what the engine computes on (the translator below refuses to count tokens on
its own). Texts to embed are tokenized by the engine alone, a batch in one call on its worker."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from service.engine.base import Embedding, EmbedItem, Encoded, TranslateItem, Translation
from tests.service.api.conftest import serving, small_settings
from tests.service.small_engines import HashEmbedder, ReverseTranslator

pytestmark = pytest.mark.anyio


class RecordingEmbedder(HashEmbedder):
    def __init__(self) -> None:
        super().__init__(name="embed-tokenized-once")
        self.encoded: list[str] = []
        self.items: list[EmbedItem] = []

    def encode(self, texts: Sequence[str]) -> list[Encoded]:
        self.encoded += texts
        return super().encode(texts)

    def embed(self, items: list[EmbedItem]) -> list[Embedding | Exception]:
        self.items += items
        return super().embed(items)


class RecordingTranslator(ReverseTranslator):
    def __init__(self) -> None:
        super().__init__(name="translate-tokenized-once")
        self.encoded: list[str] = []
        self.items: list[TranslateItem] = []

    def count_tokens(self, text: str) -> int:
        raise AssertionError("tokens counted apart from the encoding")

    def encode(self, texts: Sequence[str]) -> list[Encoded]:
        self.encoded += texts
        return super().encode(texts)

    def translate(self, items: list[TranslateItem]) -> list[Translation | Exception]:
        self.items += items
        return super().translate(items)


async def test_embedding_routes_leave_the_texts_to_the_engines_tokenizer() -> None:
    embedder = RecordingEmbedder()
    async with serving(small_settings(), {"embed": embedder, "translate": ReverseTranslator()}) as served:
        texts = ["a man eats", "two dogs play in the snow"]
        r = await served.client.post("/v1/embed", json={"texts": texts})
        assert r.status_code == 200, r.text
        r = await served.client.post("/v1/embeddings", json={"input": "a woman reads"})
        assert r.status_code == 200, r.text
    assert embedder.encoded == []  # nothing tokenized on the event loop
    assert [(it.text, it.encoded) for it in embedder.items] == [(t, None) for t in [*texts, "a woman reads"]]


async def test_translation_tokenizes_each_sentence_once_and_hands_the_encodings_over() -> None:
    translator = RecordingTranslator()
    async with serving(small_settings(), {"embed": HashEmbedder(), "translate": translator}) as served:
        r = await served.client.post("/v1/translate", json={"text": "A man eats. Two dogs play."})
        assert r.status_code == 200, r.text
    assert translator.encoded == ["A man eats.", "Two dogs play."]
    assert [it.encoded.tokens if it.encoded else None for it in translator.items] == [
        ["A", "man", "eats.", "</s>"],
        ["Two", "dogs", "play.", "</s>"],
    ]
