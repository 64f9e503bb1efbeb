"""The blocked candidates' selection gives exactly the single TopK's values and indices."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from export.graphs.top_k_blocks import block_size, block_top_k, choose_block
from service.artefacts import LOG_PROBS, TOP_K, TOP_LOG_PROBS, TOP_TOKENS


def candidates_graph(path: Path, vocab: int, opset: int) -> Path:
    """log_probs (rows, vocab) → TopK(top_k) → top_log_probs, top_tokens: the decoder's tail."""
    graph = helper.make_graph(
        [helper.make_node("TopK", [LOG_PROBS, TOP_K], [TOP_LOG_PROBS, TOP_TOKENS], axis=-1)],
        "tail",
        [
            helper.make_tensor_value_info(LOG_PROBS, TensorProto.FLOAT, ["rows", vocab]),
            helper.make_tensor_value_info(TOP_K, TensorProto.INT64, [1]),
        ],
        [
            helper.make_tensor_value_info(TOP_LOG_PROBS, TensorProto.FLOAT, ["rows", "top_k"]),
            helper.make_tensor_value_info(TOP_TOKENS, TensorProto.INT64, ["rows", "top_k"]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def run(path: Path, scores: np.ndarray, k: int) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {LOG_PROBS: scores, TOP_K: np.array([k], dtype=np.int64)})  # type: ignore[return-value]


def test_block_sizes() -> None:
    """Near √V / 2: a divisor of V when one is within a factor of 2, else padded blocks."""
    assert choose_block(8_000) == 40  # the default models' vocabulary: 200 blocks
    assert choose_block(58_101) == 107  # opus-mt-en-de's (3 · 107 · 181)
    assert choose_block(19_001) == 69  # a prime: 276 blocks, the last 43 tokens of padding
    assert choose_block(90) == 9 and choose_block(97) == 8
    assert choose_block(16) == 8 and choose_block(15) is None


@pytest.mark.parametrize(("vocab", "opset"), [(90, 17), (97, 21), (8_000, 21), (19_001, 17), (58_101, 17)])
def test_the_same_values_and_indices_as_one_top_k(tmp_path: Path, vocab: int, opset: int) -> None:
    """Random rows, rows of exact ties within and across blocks, a row all equal; k from 0 (the
    full log-probs only) to more than the number of blocks."""
    plain = candidates_graph(tmp_path / "plain.onnx", vocab, opset)
    blocked = candidates_graph(tmp_path / "blocked.onnx", vocab, opset)
    block = block_top_k(blocked, vocab)
    assert block == choose_block(vocab) and block_size(blocked) == block and block_size(plain) is None
    assert "TopK" in {n.op_type for n in onnx.load(str(blocked)).graph.node}
    rng = np.random.default_rng(vocab)
    scores = rng.standard_normal((6, vocab)).astype(np.float32)
    scores[1, ::7] = scores[1].max() + 1.0  # ties for the best tokens, in many blocks
    scores[2, block : 3 * block] = scores[2, 5]  # ties across two whole blocks and an earlier token
    scores[3] = -1.5  # every token equal: the lowest indices win
    scores[4, -1] = scores[4].max() + 1.0  # the best token in the last block
    # a tie between block 0 and a later block with a better best: the lower token still wins
    scores[5, [0, 5 * block + 1, 5 * block + 2]] = [5.0, 9.0, 5.0]
    for k in sorted({0, 1, 2, 8, -(-vocab // block) + 3}):
        want, got = run(plain, scores, k), run(blocked, scores, k)
        assert np.array_equal(want[0], got[0]) and np.array_equal(want[1], got[1]), k
    assert run(blocked, scores, 8)[1][3].tolist() == list(range(8))
    assert run(blocked, scores, 2)[1][5].tolist() == [5 * block + 1, 0]


def test_a_vocabulary_too_small_for_blocks_keeps_the_single_top_k(tmp_path: Path) -> None:
    path = candidates_graph(tmp_path / "decoder.onnx", 15, 17)
    before = path.read_bytes()
    assert block_top_k(path, 15) is None and path.read_bytes() == before
