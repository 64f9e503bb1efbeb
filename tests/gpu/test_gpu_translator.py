"""The fp16 translator on the GPU path: parity with fp32 and PyTorch, the cache and the top-k on
the device, IO binding, batching, continuous decoding, device memory after a load.

On the CPU provider the same code runs (the device backend binds CPU OrtValues), so each test's
logic is tested here; the ``cuda`` runs are what ``make gpu-check`` adds on a GPU.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from service.artefacts import BEAM_ROWS, INPUT_IDS, MEMORY_KEYS, MEMORY_ROWS, POSITIONS, SOURCE_MASK, TOP_K
from service.engine.base import TranslateItem, TranslateOptions
from service.engine.loader import load_engine
from service.engine.session import SessionConfig, resolve_providers, session_options
from service.engine.translation.candidates import Candidates
from service.engine.translation.decoding import DeviceBackend, LayerView
from service.engine.translation.translator import OnnxTranslator
from tests.gpu.conftest import PROVIDER_NAMES
from tests.service.engine.translation.test_translator import TEXTS, ids_of, items, ok, torch_ids

# what may cross to the device every step
SMALL_FEEDS = {INPUT_IDS, SOURCE_MASK, POSITIONS, TOP_K, BEAM_ROWS, MEMORY_ROWS}
SCORE_TOLERANCE = 5e-2  # fp16 against fp32, per hypothesis (length-normalised log-probability)
BATCH_TOLERANCE = 1e-2  # fp16 kernels may be picked by batch shape: alone against in a batch


def served(directory: Path, provider: str) -> OnnxTranslator:
    """The translator as the service loads it on ``provider`` (service/serving/startup.py)."""
    engine = load_engine(directory, SessionConfig(provider, 1))
    assert isinstance(engine, OnnxTranslator)
    return engine


@pytest.mark.parametrize("beam", [1, 4])
def test_fp16_translates_as_fp32_does(
    provider: str, translation_fp16: Path, translation_artefact: Path, beam: int
) -> None:
    """fp16 on the provider against fp32 on the CPU: the same tokens, scores within fp16's rounding."""
    half, full = served(translation_fp16, provider), served(translation_artefact, "cpu")
    assert (half.manifest.variant, half.provider) == ("fp16", PROVIDER_NAMES[provider])
    batch = items(TEXTS, beam_size=beam, max_length=12)
    for a, b in zip(half.translate(batch), full.translate(batch), strict=True):
        assert ok(a).hypotheses[0].tokens == ok(b).hypotheses[0].tokens
        assert ok(a).hypotheses[0].score == pytest.approx(ok(b).hypotheses[0].score, abs=SCORE_TOLERANCE)


def test_greedy_tokens_equal_the_pytorch_reference(
    provider: str, translation_fp16: Path, translation_checkpoint: Path
) -> None:
    engine = served(translation_fp16, provider)
    want = torch_ids(translation_checkpoint, TEXTS, 1, max_len=12)
    assert [ids_of(engine, r) for r in engine.translate(items(TEXTS, beam_size=1, max_length=12))] == want


def recorded_steps(engine: OnnxTranslator) -> list[tuple[dict[str, Any], Any, dict[str, Any]]]:
    """Every decoder step's feeds, scores and next cache from now on, by wrapping the backend's step."""
    steps: list[tuple[dict[str, Any], Any, dict[str, Any]]] = []
    step = engine.backend.step

    def recording(feeds: dict[str, Any], with_attention: bool, wanted: Any = None, bound: Any = None) -> Any:
        scores, attention, past = step(feeds, with_attention, wanted, bound)
        steps.append((dict(feeds), scores, past))
        return scores, attention, past

    engine.backend.step = recording  # type: ignore[method-assign]
    return steps


def test_cache_memory_and_top_k_stay_on_the_device(provider: str, translation_fp16: Path) -> None:
    """Per step, only the token ids, masks, positions, row indices and k go to the device and only
    each row's 2 × beam candidates come back: memory and cache stay OrtValues where the decoder
    runs (the memory's layers bound at their address in the encoder's output)."""
    engine = OnnxTranslator(translation_fp16, SessionConfig(provider, 1), io_binding=True)
    assert isinstance(engine.backend, DeviceBackend)
    steps = recorded_steps(engine)
    assert all(ok(r) for r in engine.translate(items(TEXTS, beam_size=4, max_length=12)))
    assert len(steps) > 3
    for feeds, scores, past in steps:
        rows = len(feeds[INPUT_IDS])
        assert isinstance(scores, Candidates) and scores.log_probs.shape == (rows, 8)
        from_host = {name for name, x in feeds.items() if isinstance(x, np.ndarray) and x.size}
        assert from_host <= SMALL_FEEDS, from_host - SMALL_FEEDS
        memory = [x for name, x in feeds.items() if name.startswith(MEMORY_KEYS)]
        assert memory and all(isinstance(x, LayerView) for x in memory)
        values = [x.stacked if isinstance(x, LayerView) else x for x in [*feeds.values(), *past.values()]]
        on_device = [x for x in values if isinstance(x, ort.OrtValue)]
        assert past and all(isinstance(x, ort.OrtValue) for x in past.values())
        assert {x.device_name().lower() for x in on_device} == {provider}


def profiled_nodes(session: ort.InferenceSession) -> list[dict[str, Any]]:
    """The node events of ``session``'s profile (ended here)."""
    events = json.loads(Path(session.end_profiling()).read_text())
    return [e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")]


def test_no_half_precision_tensor_is_copied_inside_a_decoder_step(
    provider: str, translation_fp16: Path, tmp_path: Path
) -> None:
    """onnxruntime's profile of the decoder: its copies between host and device (Memcpy nodes, where
    a node runs on another provider than its neighbours) move int64 inputs only, never the fp16
    cache, memory or activations; every node runs on the provider asked for, or on the CPU for
    shape arithmetic."""
    engine = OnnxTranslator(translation_fp16, SessionConfig(provider, 1), io_binding=True)
    assert isinstance(engine.backend, DeviceBackend)
    options = session_options(1, 1)
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "decoder")
    spec = engine.manifest.graphs["decoder"]
    engine.backend.decoder = ort.InferenceSession(
        str(translation_fp16 / spec.file), sess_options=options, providers=resolve_providers(provider)
    )
    assert all(ok(r) for r in engine.translate(items(TEXTS, beam_size=4, max_length=12)))
    nodes = profiled_nodes(engine.backend.decoder)
    assert nodes
    copies = [e["args"] for e in nodes if e["args"]["op_name"].startswith("Memcpy")]
    halves = [c for c in copies if "float16" in json.dumps(c.get("output_type_shape", c))]
    assert not halves, halves[:3]
    providers = {e["args"]["provider"] for e in nodes}
    assert providers <= {PROVIDER_NAMES[provider], "CPUExecutionProvider"}
    assert PROVIDER_NAMES[provider] in providers


def test_io_binding_answers_as_the_host_backend(provider: str, translation_fp16: Path) -> None:
    """The device backend (IO binding, cache as OrtValues, reordered by the decoder graph itself)
    against ``session.run`` with NumPy every step, on the same provider."""
    device = OnnxTranslator(translation_fp16, SessionConfig(provider, 1), io_binding=True)
    host = OnnxTranslator(translation_fp16, SessionConfig(provider, 1), io_binding=False)
    assert isinstance(device.backend, DeviceBackend) and not isinstance(host.backend, DeviceBackend)
    batch = items(TEXTS, beam_size=3, n_best=2, max_length=10, alignments=True)
    for a, b in zip(device.translate(batch), host.translate(batch), strict=True):
        assert [h.tokens for h in ok(a).hypotheses] == [h.tokens for h in ok(b).hypotheses]
        np.testing.assert_allclose(
            [h.score for h in ok(a).hypotheses], [h.score for h in ok(b).hypotheses], atol=1e-3
        )
        align_a, align_b = ok(a).hypotheses[0].alignment, ok(b).hypotheses[0].alignment
        assert align_a is not None and align_b is not None
        np.testing.assert_allclose(align_a, align_b, atol=1e-3)


def test_the_same_answer_alone_and_inside_batches(provider: str, translation_fp16: Path) -> None:
    """Batching must not change a translation: each item alone against all together, options mixed."""
    engine = served(translation_fp16, provider)
    batch = items(TEXTS, beam_size=4, max_length=12) + items(TEXTS[:3], beam_size=2, n_best=2, max_length=8)
    together = engine.translate(batch)
    for item, joint in zip(batch, together, strict=True):
        (alone,) = engine.translate([item])
        assert [h.tokens for h in ok(joint).hypotheses] == [h.tokens for h in ok(alone).hypotheses]
        np.testing.assert_allclose(
            [h.score for h in ok(joint).hypotheses],
            [h.score for h in ok(alone).hypotheses],
            atol=BATCH_TOLERANCE,
        )


def test_sentences_join_a_running_decode(provider: str, translation_fp16: Path) -> None:
    """Continuous decoding as the service's scheduler drives it: sentences admitted between two
    steps of a running decode translate as they do alone."""
    engine = served(translation_fp16, provider)
    if not engine.joins_midway:
        pytest.xfail(
            f"{type(engine.backend).__name__} on {provider} cannot admit sentences into a running "
            "decode: the service falls back to whole batches there (issue 41)"
        )
    options = TranslateOptions(beam_size=4, max_length=12)
    sources = engine.encode(TEXTS)
    decode = engine.new_decode()
    found = {s.key: s.results() for s in decode.admit([(i, sources[i], options) for i in range(3)])}
    steps = 0
    while decode.sentences or steps < 2:
        if steps == 2:
            assert decode.can_admit() and decode.sentences, "the first three should still be decoding"
            joining = [(i, sources[i], options) for i in range(3, len(TEXTS))]
            found |= {s.key: s.results() for s in decode.admit(joining)}
        found |= {s.key: s.results() for s in decode.step()}
        steps += 1
    alone = engine.translate(items(TEXTS, beam_size=4, max_length=12))
    assert [found[i][0].tokens for i in range(len(TEXTS))] == [ids_of(engine, r) for r in alone]


def device_memory_used() -> int:
    """Bytes in use on GPU 0 (NVML: the driver's figure, every allocator included)."""
    pynvml = pytest.importorskip("pynvml")
    pynvml.nvmlInit()
    return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)


@pytest.mark.cuda
@pytest.mark.usefixtures("cuda")
def test_device_memory_is_released_after_a_load(translation_fp16: Path) -> None:
    """Loading, using and dropping the fp16 translator three times leaves the device's memory where
    one load and unload left it (the CUDA context stays; the arena and the handles must not)."""
    batch = items(TEXTS * 16, beam_size=4, max_length=12)

    def load_and_drop() -> int:
        engine = served(translation_fp16, "cuda")
        assert all(ok(r) for r in engine.translate(batch))
        del engine
        gc.collect()
        return device_memory_used()

    first = load_and_drop()
    after = [load_and_drop() for _ in range(3)]
    assert max(after) - first <= 64 << 20, [(x - first) >> 20 for x in after]


@pytest.mark.parametrize("beam", [1, 4])
def test_required_phrases_hold_on_the_device_as_on_the_host(
    provider: str, translation_fp16: Path, translation_artefact: Path, beam: int
) -> None:
    """Constrained decoding through the device backend (fp16, IO binding): every output holds its
    sentence's required words, as the host backend's fp32 outputs do, unconstrained rows beside them."""
    half, full = served(translation_fp16, provider), served(translation_artefact, "cpu")
    required = [("street",), (), ("dogs", "man"), ("red",), (), ("cat",)]
    batch = [
        TranslateItem(text, TranslateOptions(beam_size=beam, max_length=12, required=words))
        for text, words in zip(TEXTS, required, strict=False)
    ]
    for engine in (half, full):
        for item, result in zip(batch, engine.translate(batch), strict=True):
            words = ok(result).hypotheses[0].text.split()
            assert all(w in words for w in item.options.required), (item, words)
