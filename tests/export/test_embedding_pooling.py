"""The graph's pooling (export/sources/bert.py: ``pool``) against sentence-transformers' own
Pooling module, every mode, on right-padded batches; and the service's NumPy normalisation."""

from __future__ import annotations

import numpy as np
import pytest

from export.sources.bert import Pooling
from service.engine.pooling import l2_normalize

torch = pytest.importorskip("torch")
st_pooling = pytest.importorskip("sentence_transformers.sentence_transformer.modules.pooling")


@pytest.mark.parametrize("mode", ["mean", "cls", "lasttoken"])
def test_the_graphs_pooling_is_sentence_transformers(mode: Pooling) -> None:
    from export.sources.bert import pool

    rng = np.random.default_rng(1)
    hidden = torch.from_numpy(rng.normal(size=(4, 6, 5)).astype(np.float32))
    mask = torch.from_numpy((np.arange(6)[None, :] < np.array([6, 2, 1, 4])[:, None]).astype(np.int64))
    hidden[1, 2:] = 1e6  # padding positions: must not leak into the vector
    expected = st_pooling.Pooling(5, pooling_mode=mode)({"token_embeddings": hidden, "attention_mask": mask})
    np.testing.assert_allclose(
        pool(hidden, mask, mode).numpy(), expected["sentence_embedding"].numpy(), rtol=1e-6
    )


@pytest.mark.parametrize("mode", ["mean", "lasttoken"])
def test_a_row_without_tokens_pools_to_zeros(mode: Pooling) -> None:
    from export.sources.bert import pool

    pooled = pool(torch.ones((2, 3, 4)), torch.tensor([[0, 0, 0], [1, 0, 0]]), mode)
    np.testing.assert_array_equal(pooled.numpy(), [[0.0] * 4, [1.0] * 4])


def test_l2_normalize() -> None:
    x = np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32)
    y = l2_normalize(x)
    np.testing.assert_allclose(y, [[0.6, 0.8], [0.0, 0.0]])
    assert y.dtype == np.float32
