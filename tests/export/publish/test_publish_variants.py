"""export/publish/variants.py: variant parsing, and the one path that stages, verifies and publishes."""

from __future__ import annotations

from pathlib import Path

import pytest

from export.publish.variants import parse_variants, publish_variant
from export.verify import VerificationError
from service.artefacts import FileEntry, Manifest, ReferenceCheck, SourceInfo, SpecialIds, file_entry


def test_variants_in_canonical_order_all_next_to_others() -> None:
    assert parse_variants(["fp16", "fp32"]) == ["fp32", "fp16"]
    assert parse_variants(["all"]) == ["fp32", "int8", "fp16"]
    assert parse_variants(["int8", "all", "int8"]) == ["fp32", "int8", "fp16"]
    with pytest.raises(ValueError, match="unknown variant 'int4'"):
        parse_variants(["fp32", "int4"])
    with pytest.raises(ValueError, match="no variant"):
        parse_variants([])


def _manifest(staging: Path, parity: dict[str, float]) -> Manifest:
    files: list[FileEntry] = [file_entry(staging, "tokenizer.json")]
    return Manifest(
        name="m",
        task="embed",
        variant="fp32",
        source=SourceInfo(kind="bert", path="src", sha256="0" * 64),
        files=files,
        graphs={},
        vocab_size=1,
        special_ids=SpecialIds(pad=0),
        opset=17,
        ir_version=8,
        onnxruntime_version="test",
        parity=parity,
        created_at="now",
    )


def _publish(target: Path, content: str, verify_ok: bool = True) -> None:
    def build(staging: Path) -> dict[str, int]:
        (staging / "tokenizer.json").write_text(content, encoding="utf-8")
        return {}

    def manifest_for(
        staging: Path, fusions: dict[str, int], parity: dict[str, float], check: ReferenceCheck | None
    ) -> Manifest:
        return _manifest(staging, parity)

    def verify(staging: Path) -> tuple[dict[str, float], ReferenceCheck | None]:
        assert (staging / "manifest.json").is_file()  # the provisional one: the loader can open it
        if not verify_ok:
            raise VerificationError("out of tolerance")
        return {"max_abs": 0.5}, None

    publish_variant(target, build, manifest_for, verify)


def test_published_only_once_verified_and_a_failure_keeps_the_earlier_artefact(tmp_path: Path) -> None:
    target = tmp_path / "m" / "fp32"
    _publish(target, "first")
    assert (target / "tokenizer.json").read_text(encoding="utf-8") == "first"
    assert '"max_abs": 0.5' in (target / "manifest.json").read_text(encoding="utf-8")

    with pytest.raises(VerificationError):
        _publish(target, "second", verify_ok=False)
    assert (target / "tokenizer.json").read_text(encoding="utf-8") == "first"
    assert sorted(p.name for p in target.parent.iterdir()) == ["fp32"]  # no staging left behind

    _publish(target, "third")
    assert (target / "tokenizer.json").read_text(encoding="utf-8") == "third"
    assert sorted(p.name for p in target.parent.iterdir()) == ["fp32"]  # the old one removed
