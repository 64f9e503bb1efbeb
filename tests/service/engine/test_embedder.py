"""OnnxEmbedder on a tiny exported BERT: parity with PyTorch pooling, per-item errors, batching."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from service.artefacts import ArtefactError
from service.engine.base import Embedding, EmbedItem, TextTooLong
from service.engine.embedder import OnnxEmbedder
from service.engine.loader import load_engine
from service.engine.session import SessionConfig
from service.engine.tokenizer import SubBatches
from service.engine.translation.translator import OnnxTranslator
from service.metrics import INPUT_TOKENS

TEXTS = [
    "a man rides a bike",
    "two dogs",
    "the small cat sits on the big red street, the big red street!",
    "red",
    "dogs sit on a man?",
]


@pytest.fixture(scope="module")
def embedder(embedding_artefact: Path) -> OnnxEmbedder:
    engine = OnnxEmbedder(embedding_artefact, SessionConfig("cpu", 1))
    engine.warmup()
    return engine


def ok(result: Embedding | Exception) -> Embedding:
    assert isinstance(result, Embedding), result
    return result


def torch_hidden(source: Path, texts: list[str], max_len: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch last_hidden_state and attention mask of the source model, texts padded together
    and truncated at the model's max length (as sentence-transformers does)."""
    import torch
    from transformers import AutoTokenizer, BertModel

    tok = AutoTokenizer.from_pretrained(str(source))
    model = BertModel.from_pretrained(str(source)).eval()
    enc = tok(texts, padding=True, truncation=True, max_length=max_len, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state
    return hidden.numpy(), enc["attention_mask"].numpy()


def test_vectors_equal_pytorch_mean_pooling(embedder: OnnxEmbedder, embedding_source: Path) -> None:
    """Un-normalised mean pooling over real tokens, as the source model computes it; and the
    L2-normalised vectors equal sentence-transformers' encode()."""
    from sentence_transformers import SentenceTransformer

    assert embedder.count_tokens(TEXTS[2]) > embedder.info.max_len == 16  # one text is truncated
    hidden, mask = torch_hidden(embedding_source, TEXTS)
    want = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    got = np.stack([ok(r).vector for r in embedder.embed([EmbedItem(t) for t in TEXTS])])
    assert got.dtype == np.float32 and got.shape == (len(TEXTS), embedder.info.dim)
    np.testing.assert_allclose(got, want, atol=1e-5)
    st = SentenceTransformer(str(embedding_source), device="cpu").encode(TEXTS, convert_to_numpy=True)
    np.testing.assert_allclose(got / np.linalg.norm(got, axis=1, keepdims=True), st, atol=1e-5)
    assert embedder.provider == "CPUExecutionProvider"


def test_items_carrying_their_whole_encodings_embed_as_items_without(embedder: OnnxEmbedder) -> None:
    """The route tokenizes once and hands the encodings over; truncation still applies to them."""
    whole = embedder.encode(TEXTS)
    assert [e.n_tokens for e in whole] == [embedder.count_tokens(t) for t in TEXTS]
    given = embedder.embed([EmbedItem(t, True, e) for t, e in zip(TEXTS, whole, strict=True)])
    plain = embedder.embed([EmbedItem(t) for t in TEXTS])
    for a, b in zip(given, plain, strict=True):
        np.testing.assert_array_equal(ok(a).vector, ok(b).vector)
        assert ok(a).n_tokens == ok(b).n_tokens <= embedder.info.max_len
    (refused,) = embedder.embed([EmbedItem(TEXTS[2], False, whole[2])])
    assert isinstance(refused, TextTooLong)


def test_an_item_that_asks_gets_its_vector_normalised_and_only_it(embedder: OnnxEmbedder) -> None:
    """Normalisation happens in the engine's post stage, per item: its batch neighbours that did
    not ask keep their pooled vectors."""
    plain = [ok(r).vector for r in embedder.embed([EmbedItem(t) for t in TEXTS])]
    asks = [i % 2 == 0 for i in range(len(TEXTS))]
    mixed = embedder.embed([EmbedItem(t, normalize=n) for t, n in zip(TEXTS, asks, strict=True)])
    for vector, result, normalize in zip(plain, mixed, asks, strict=True):
        want = vector / np.linalg.norm(vector) if normalize else vector
        np.testing.assert_allclose(ok(result).vector, want, rtol=1e-6, atol=1e-7)


def test_dimensions_keep_the_first_ones_normalised_after_the_cut(embedder: OnnxEmbedder) -> None:
    """Matryoshka: an item asking for N dimensions gets the pooled vector's first N, a unit vector
    again when it normalises; its batch neighbours keep all of theirs."""
    plain = [ok(r).vector for r in embedder.embed([EmbedItem(t) for t in TEXTS[:3]])]
    items = [
        EmbedItem(TEXTS[0], normalize=True, dimensions=8),
        EmbedItem(TEXTS[1], dimensions=5),
        EmbedItem(TEXTS[2]),
    ]
    short_unit, short_raw, full = (ok(r).vector for r in embedder.embed(items))
    np.testing.assert_allclose(short_unit, plain[0][:8] / np.linalg.norm(plain[0][:8]), rtol=1e-6, atol=1e-7)
    assert np.linalg.norm(short_unit) == pytest.approx(1.0)
    np.testing.assert_allclose(short_raw, plain[1][:5], rtol=1e-6)
    np.testing.assert_allclose(full, plain[2], rtol=1e-6)
    assert short_unit.flags.c_contiguous and short_unit.dtype == np.float32


def test_mixed_lengths_and_sub_batches_do_not_change_results(embedding_artefact: Path) -> None:
    """Length-sorted, padded sub-batches give each text what it gets alone, in request order."""
    engine = OnnxEmbedder(embedding_artefact, SessionConfig("cpu", 1), SubBatches(2, 24))
    together = engine.embed([EmbedItem(t) for t in TEXTS])
    for text, result in zip(TEXTS, together, strict=True):
        (alone,) = engine.embed([EmbedItem(text)])
        np.testing.assert_allclose(ok(result).vector, ok(alone).vector, atol=1e-5)
        assert ok(result).n_tokens == ok(alone).n_tokens == min(engine.count_tokens(text), 16)


def test_an_engine_on_cuda_cuts_its_batches_as_a_device_does(
    embedding_artefact: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its session on CUDA, the engine's sub-batches take the device's run cost; on the CPU, the
    CPU's (the provider onnxruntime reports, as a CUDA session would)."""
    from service.cuda import CUDA
    from service.engine import embedder as embedder_module

    limits = SubBatches(8, 512)
    assert OnnxEmbedder(embedding_artefact, SessionConfig("cpu", 1), limits).sub_batches == limits
    monkeypatch.setattr(embedder_module, "used_provider", lambda _: CUDA)
    on_cuda = OnnxEmbedder(embedding_artefact, SessionConfig("cpu", 1), limits)
    assert on_cuda.sub_batches == limits.on_device() != limits


def test_runs_padded_to_the_device_s_shapes_give_each_text_its_own_vector(
    embedding_artefact: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On CUDA a run is padded to rows a multiple of 8 and a length a multiple of 16: the rows
    added are dropped, and each text's vector is the one the CPU's unpadded runs give it."""
    runs: list[tuple[int, ...]] = []
    on_cpu = OnnxEmbedder(embedding_artefact, SessionConfig("cpu", 1))
    device = OnnxEmbedder(embedding_artefact, SessionConfig("cpu", 1), SubBatches().on_device())
    real_run = device.session.run
    monkeypatch.setattr(
        device.session,
        "run",
        lambda names, feeds: runs.append(feeds["input_ids"].shape) or real_run(names, feeds),
    )
    items = [EmbedItem(t, normalize=k % 2 == 0) for k, t in enumerate(TEXTS)]
    padded = device.embed(items)
    assert runs == [(8, 16)] and len(padded) == len(TEXTS)
    for got, want in zip(padded, on_cpu.embed(items), strict=True):
        np.testing.assert_allclose(ok(got).vector, ok(want).vector, atol=1e-5)
        assert ok(got).n_tokens == ok(want).n_tokens


def test_too_long_fails_alone_unless_truncation_is_on(embedder: OnnxEmbedder) -> None:
    long_text = " ".join(["red dogs"] * 20)
    assert embedder.count_tokens(long_text) > embedder.info.max_len
    got = embedder.embed(
        [EmbedItem(TEXTS[0]), EmbedItem(long_text, truncate=False), EmbedItem(long_text), EmbedItem(TEXTS[1])]
    )
    assert isinstance(got[1], TextTooLong)
    assert ok(got[2]).n_tokens == embedder.info.max_len
    for i, text in ((0, TEXTS[0]), (3, TEXTS[1])):
        np.testing.assert_allclose(
            ok(got[i]).vector, ok(embedder.embed([EmbedItem(text)])[0]).vector, atol=1e-5
        )


def test_empty_text_embeds_the_special_tokens(embedder: OnnxEmbedder) -> None:
    empty, blank = embedder.embed([EmbedItem(""), EmbedItem("   ")])
    assert ok(empty).n_tokens == ok(blank).n_tokens == 2  # [CLS] [SEP]
    assert np.isfinite(ok(empty).vector).all()
    assert embedder.embed([]) == []


def test_input_tokens_are_counted(embedder: OnnxEmbedder) -> None:
    counter = INPUT_TOKENS.labels(model=embedder.name)
    before = counter._value.get()
    results = embedder.embed([EmbedItem(t) for t in TEXTS[:3]])
    assert counter._value.get() - before == sum(ok(r).n_tokens for r in results)


def test_loader_and_task_checks(embedding_artefact: Path, translation_artefact: Path) -> None:
    assert isinstance(load_engine(embedding_artefact, SessionConfig("cpu", 1)), OnnxEmbedder)
    with pytest.raises(ArtefactError, match="not an embedding"):
        OnnxEmbedder(translation_artefact, SessionConfig("cpu"))
    with pytest.raises(ArtefactError, match="not a translation"):
        OnnxTranslator(embedding_artefact, SessionConfig("cpu"))


def test_sub_batches_are_length_sorted_within_both_budgets(embedding_artefact: Path) -> None:
    engine = OnnxEmbedder(embedding_artefact, SessionConfig("cpu", 1), SubBatches(2, 20))
    encoded = engine.tokenizer.encode_batch(TEXTS, [True] * len(TEXTS))
    todo = {i: e for i, e in enumerate(encoded) if not isinstance(e, Exception)}
    chunks = engine.sub_batches.cut({i: e.n_tokens for i, e in todo.items()})
    order = [i for chunk in chunks for i in chunk]
    assert sorted(order) == list(range(len(TEXTS)))
    lengths = [todo[i].n_tokens for i in order]
    assert lengths == sorted(lengths)
    for chunk in chunks:
        longest = max(todo[i].n_tokens for i in chunk)
        assert len(chunk) == 1 or (len(chunk) <= 2 and len(chunk) * longest <= 20)
