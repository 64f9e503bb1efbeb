"""Settings: defaults, the TSERVE_ environment, list parsing, validation, variant choice."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from service.settings import Settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("TSERVE_"):
            monkeypatch.delenv(name)


def test_defaults() -> None:
    s = Settings()
    assert (s.host, s.port) == ("0.0.0.0", 8000)
    assert s.artefact_root == Path(".artefacts")
    assert s.translation_models == ["transformer-en-de", "transformer-de-en"]
    assert s.embed_model == "all-MiniLM-L6-v2"
    assert s.api_keys == [] and s.cors_origins == []
    assert s.auto_export is True


def test_environment_with_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TSERVE_PORT", "9000")
    monkeypatch.setenv("TSERVE_MAX_BATCH_SIZE", "8")
    monkeypatch.setenv("TSERVE_AUTO_EXPORT", "false")
    monkeypatch.setenv("TSERVE_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("PORT", "1")  # unprefixed: not ours
    s = Settings()
    assert (s.port, s.max_batch_size, s.auto_export, s.log_level) == (9000, 8, False, "debug")


@pytest.mark.parametrize("raw", ["k1,k2", " k1 , k2 ", '["k1", "k2"]'])
def test_lists_from_comma_separated_or_json(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("TSERVE_API_KEYS", raw)
    assert Settings().api_keys == ["k1", "k2"]


def test_empty_list_means_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TSERVE_CORS_ORIGINS", "")
    assert Settings().cors_origins == []


@pytest.mark.parametrize(
    "field, value",
    [
        ("port", 0),
        ("max_batch_size", 0),
        ("max_items_per_request", 100_000),
        ("max_chars_per_text", 0),
        ("request_timeout_s", 0),
        ("provider", "tpu"),
        ("variant", "int4"),
        ("api_keys", ["  "]),
    ],
)
def test_invalid_values_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValidationError, match=field):
        Settings.model_validate({field: value})


def test_cross_field_checks() -> None:
    with pytest.raises(ValidationError, match="max_queue"):
        Settings(max_queue=10, max_items_per_request=20)
    with pytest.raises(ValidationError, match="at least one model"):
        Settings(translate_model="", embed_model="")


@pytest.mark.parametrize(
    "variant, provider, cpu_variant, expected",
    [
        ("auto", "cuda", "int8", "fp16"),
        ("auto", "cpu", "int8", "int8"),
        ("auto", "cpu", "fp32", "fp32"),
        ("fp32", "cuda", "int8", "fp32"),
    ],
)
def test_variant_resolution(variant: str, provider: str, cpu_variant: str, expected: str) -> None:
    s = Settings.model_validate({"variant": variant, "provider": provider, "cpu_variant": cpu_variant})
    assert s.resolved_variant() == expected
    assert s.model_dir("m", s.resolved_variant()) == Path(".artefacts") / "m" / expected


@pytest.mark.parametrize(
    ("available", "expected"),
    [
        (["CUDAExecutionProvider", "CPUExecutionProvider"], "cuda"),  # onnxruntime-gpu
        (["CPUExecutionProvider"], "cpu"),
        (["TensorrtExecutionProvider", "CPUExecutionProvider"], "cpu"),  # not CUDA itself
    ],
)
def test_auto_provider_is_cuda_exactly_when_onnxruntime_offers_it(
    monkeypatch: pytest.MonkeyPatch, available: list[str], expected: str
) -> None:
    """The providers of the installed onnxruntime build decide ``auto``; an explicit setting wins."""
    import onnxruntime

    from service import cuda

    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: available)
    monkeypatch.setattr(cuda, "cuda_devices", lambda: 1)
    assert Settings().provider == "auto"
    assert Settings().resolved_provider() == expected
    assert Settings(provider="cpu").resolved_provider() == "cpu"


def test_auto_provider_is_the_cpu_where_the_driver_sees_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime-gpu installed on a machine without a GPU: auto serves on the CPU (the CPU
    variant), instead of choosing fp16 for a provider that cannot start."""
    import onnxruntime

    from service import cuda

    monkeypatch.setattr(
        onnxruntime, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    monkeypatch.setattr(cuda, "cuda_devices", lambda: 0)
    assert Settings().resolved_provider() == "cpu"
    assert Settings().resolved_variant() == Settings().cpu_variant


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, ["transformer-en-de", "transformer-de-en"]),  # DEFAULT_TRANSLATE_MODELS
        (
            {"TSERVE_TRANSLATE_MODELS": "transformer-en-de,transformer-de-en"},
            ["transformer-en-de", "transformer-de-en"],
        ),
        (
            {"TSERVE_TRANSLATE_MODELS": '["opus-mt-de-en", "transformer-en-de"]'},
            ["opus-mt-de-en", "transformer-en-de"],
        ),
        ({"TSERVE_TRANSLATE_MODEL": "opus-mt-en-fr"}, ["opus-mt-en-fr"]),  # the one-model shorthand
        ({"TSERVE_TRANSLATE_MODEL": ""}, []),  # no translation
        ({"TSERVE_TRANSLATE_MODELS": "", "TSERVE_TRANSLATE_MODEL": "m"}, ["m"]),  # an empty list is unset
    ],
)
def test_translation_models(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: list[str]
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert Settings().translation_models == expected


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"translate_models": ["a", "b"], "translate_model": "a"}, "not both"),
        ({"translate_models": "a, b, a"}, "listed more than once: a"),
        ({"translate_models": ["a", " "]}, "must not be blank"),
        ({"translate_model": "", "embed_model": ""}, "at least one model"),
    ],
)
def test_translation_models_refused(values: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings.model_validate(values)


def test_session_threads_share_the_cores_among_concurrent_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """0: the usable cores divided among one model's concurrent runs (workers + express), ≥ 1;
    a value set is kept."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert Settings().session_threads() == 5  # two workers and the express one
    assert Settings(express_max_tokens=0).session_threads() == 8
    assert Settings(worker_threads=3).session_threads() == 4
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert Settings().session_threads() == 1
    assert Settings(worker_threads=4).session_threads() == 1
    assert Settings(intra_op_threads=2).session_threads() == 2
