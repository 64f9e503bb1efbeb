"""The service's NumPy pooling: sentence-transformers' numerics, without torch."""

from __future__ import annotations

import numpy as np
import pytest

from service.engine.pooling import cls_pool, l2_normalize, last_token_pool, mean_pool, pool


def _hidden() -> tuple[np.ndarray, np.ndarray]:
    hidden = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
    mask = np.array([[1, 1, 1], [1, 1, 0]], dtype=np.int64)
    hidden[1, 2] = 1e6  # a padding position: must not leak into the mean
    return hidden, mask


def test_mean_pool_ignores_padding() -> None:
    hidden, mask = _hidden()
    pooled = mean_pool(hidden, mask)
    np.testing.assert_allclose(pooled, [[2.0, 3.0], [7.0, 8.0]])
    assert pooled.dtype == np.float32 and pooled.shape == (2, 2)


def test_mean_pool_of_an_empty_row_is_zero_not_nan() -> None:
    pooled = mean_pool(np.ones((1, 2, 3), np.float32), np.zeros((1, 2), np.int64))
    assert np.all(pooled == 0.0)


def test_mean_pool_accepts_float16_and_returns_float32() -> None:
    hidden, mask = _hidden()
    hidden[1, 2] = 0.0
    pooled = mean_pool(hidden.astype(np.float16), mask)
    assert pooled.dtype == np.float32
    np.testing.assert_allclose(pooled, [[2.0, 3.0], [7.0, 8.0]])


def test_cls_pool_takes_the_first_token() -> None:
    hidden, mask = _hidden()
    np.testing.assert_array_equal(cls_pool(hidden, mask), hidden[:, 0, :])
    np.testing.assert_array_equal(cls_pool(hidden), hidden[:, 0, :])


def test_l2_normalize() -> None:
    x = np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32)
    y = l2_normalize(x)
    np.testing.assert_allclose(y, [[0.6, 0.8], [0.0, 0.0]])
    assert y.dtype == np.float32


def test_matches_the_sentence_transformers_formula() -> None:
    """sum(h·m)/clamp(sum(m), 1e-9), then x / max(‖x‖, 1e-12), written out independently."""
    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(4, 7, 5)).astype(np.float32)
    lengths = np.array([7, 3, 1, 5])
    mask = (np.arange(7)[None, :] < lengths[:, None]).astype(np.int64)
    expected = np.stack([hidden[i, : lengths[i]].mean(axis=0) for i in range(4)])
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(l2_normalize(mean_pool(hidden, mask)), expected, rtol=1e-5, atol=1e-6)


def test_pool_dispatch() -> None:
    hidden, mask = _hidden()
    np.testing.assert_array_equal(pool(hidden, mask, "mean"), mean_pool(hidden, mask))
    np.testing.assert_array_equal(pool(hidden, mask, "cls"), cls_pool(hidden))
    np.testing.assert_array_equal(pool(hidden, mask, "lasttoken"), last_token_pool(hidden, mask))
    with pytest.raises(ValueError, match="max"):
        pool(hidden, mask, "max")  # type: ignore[arg-type]


def test_last_token_pool_takes_the_last_real_token_not_the_padding() -> None:
    hidden, mask = _hidden()
    pooled = last_token_pool(hidden, mask)
    np.testing.assert_array_equal(pooled, [hidden[0, 2], hidden[1, 1]])  # row 1's position 2 is padding
    assert pooled.dtype == np.float32


def test_last_token_pool_of_an_empty_row_is_zero_and_float16_comes_back_float32() -> None:
    hidden = np.ones((2, 3, 4), np.float16)
    mask = np.array([[0, 0, 0], [1, 0, 0]], dtype=np.int64)
    pooled = last_token_pool(hidden, mask)
    assert pooled.dtype == np.float32
    np.testing.assert_array_equal(pooled, [[0.0] * 4, [1.0] * 4])


def test_last_token_pool_matches_sentence_transformers() -> None:
    """Its ``lasttoken`` mode on the same right-padded batch."""
    torch = pytest.importorskip("torch")
    pooling = pytest.importorskip("sentence_transformers.sentence_transformer.modules.pooling")
    rng = np.random.default_rng(1)
    hidden = rng.normal(size=(4, 6, 5)).astype(np.float32)
    mask = (np.arange(6)[None, :] < np.array([6, 2, 1, 4])[:, None]).astype(np.int64)
    features = {"token_embeddings": torch.from_numpy(hidden), "attention_mask": torch.from_numpy(mask)}
    module = pooling.Pooling(5, pooling_mode="lasttoken")
    expected = module(features)["sentence_embedding"].numpy()
    np.testing.assert_array_equal(last_token_pool(hidden, mask), expected)
