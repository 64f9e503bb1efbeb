"""export/publish/provenance.py: what a model was trained on, from its model card into its manifest;
an artefact exported before the field gets it without being exported again."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from export.publish.provenance import ModelCardError, front_matter, trained_on
from service.artefacts import load_and_verify, read_manifest, write_manifest

REPO = Path(__file__).resolve().parents[3]
CAPTIONS = "Multi30k: English descriptions of Flickr photos with German translations (image captions)"


def card(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(text, encoding="utf-8")
    return directory


def test_our_card_names_it_in_its_front_matter_read_from_the_weights_or_their_directory(
    tmp_path: Path,
) -> None:
    directory = card(tmp_path / "ours", "MODEL_CARD.md", f'---\ntrained_on: "{CAPTIONS}"\n---\n\n# ours\n')
    assert trained_on(directory) == CAPTIONS
    assert trained_on(directory / "model.safetensors") == CAPTIONS  # a weights file: its directory's card


def test_a_hugging_face_card_names_its_datasets(tmp_path: Path) -> None:
    listed = card(
        tmp_path / "hf", "README.md", "---\nlicense: apache-2.0\ndatasets:\n- snli\n- multi_nli\n---\n"
    )
    assert trained_on(listed) == "datasets named by its model card: snli, multi_nli"
    single = card(tmp_path / "one", "README.md", "---\ndatasets: opus\n---\n# opus-mt\n")
    assert trained_on(single) == "datasets named by its model card: opus"


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("README.md", "# opus-mt-en-de\n\n* dataset: opus\n"),  # no front matter: no claim
        ("README.md", "---\nlicense: cc-by-4.0\ntags:\n- translation\n---\n"),  # names no datasets
        ("README.md", "---\n---\n"),
        ("MODEL_CARD.md", "---\nlicense: mit\n---\n"),
    ],
)
def test_a_card_that_does_not_say_gives_none(tmp_path: Path, name: str, text: str) -> None:
    assert trained_on(card(tmp_path / "m", name, text)) is None


def test_a_directory_without_a_card_gives_none(tmp_path: Path) -> None:
    assert trained_on(tmp_path) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("---\ntrained_on: captions\n", "never closed"),
        ("---\n- a\n- b\n---\n", "not a mapping"),
        ("---\ntrained_on: [a\n---\n", "unreadable front matter"),
        ('---\ntrained_on: ""\n---\n', "non-empty line of text"),
        ("---\ntrained_on: 3\n---\n", "non-empty line of text"),
    ],
)
def test_an_unreadable_card_is_an_error_naming_it(tmp_path: Path, text: str, message: str) -> None:
    directory = card(tmp_path / "bad", "MODEL_CARD.md", text)
    with pytest.raises(ModelCardError, match=message) as error:
        trained_on(directory)
    assert "MODEL_CARD.md" in str(error.value)


@pytest.mark.parametrize(
    ("name", "source", "target"), [("en-de", "English", "German"), ("de-en", "German", "English")]
)
def test_the_default_translators_cards_say_image_captions_of_multi30k(
    name: str, source: str, target: str
) -> None:
    """What the README's first table says they know."""
    said = trained_on(REPO / "export" / "checkpoints" / f"transformer-{name}" / "model.safetensors")
    assert said is not None and said.startswith("Multi30k:") and "image captions" in said
    assert f"{source} descriptions of Flickr photos with their {target} translations" in said
    assert front_matter(REPO / "export" / "checkpoints" / f"transformer-{name}" / "MODEL_CARD.md").keys() == {
        "trained_on"
    }


def test_the_export_records_it_and_adds_it_to_an_artefact_from_before_the_field(tmp_path: Path) -> None:
    """Written into each exported manifest; an up-to-date artefact whose manifest lacks it (or says
    another) gets it in place: the same graphs and files, not exported again."""
    pytest.importorskip("transformers")
    from export.embedding import export_embedding
    from tests.tiny_models import tiny_bert_dir

    source = tiny_bert_dir(tmp_path / "tiny-bert")
    card(source, "README.md", "---\ndatasets:\n- snli\n---\n")
    (artefact,) = export_embedding(source, tmp_path / "artefacts", ["fp32"])
    exported = read_manifest(artefact)
    assert exported.trained_on == "datasets named by its model card: snli"

    write_manifest(artefact, exported.model_copy(update={"trained_on": None}))  # as exported before it
    graph = artefact / "encoder.onnx"
    graph_written = graph.stat().st_mtime_ns
    assert export_embedding(source, tmp_path / "artefacts", ["fp32"]) == [artefact]
    recorded = load_and_verify(artefact)
    assert recorded == exported  # created_at too: the same export, only the field added
    assert graph.stat().st_mtime_ns == graph_written

    card(source, "README.md", "---\ndatasets:\n- snli\n- multi_nli\n---\n")  # the card edited since
    export_embedding(source, tmp_path / "artefacts", ["fp32"])
    assert read_manifest(artefact).trained_on == "datasets named by its model card: snli, multi_nli"
    assert read_manifest(artefact).created_at == exported.created_at


def test_a_translation_export_records_our_card_and_adds_it_to_an_artefact_from_before_the_field(
    translation_checkpoint: Path, tmp_path: Path
) -> None:
    """The run's tiny checkpoint (tests/conftest.py), copied to be given a card."""
    from export.translation import export_translation
    from tests.tiny_models import few_reference_sentences

    checkpoint = Path(shutil.copytree(translation_checkpoint, tmp_path / "tiny-en-de"))
    card(checkpoint, "MODEL_CARD.md", f'---\ntrained_on: "{CAPTIONS}"\n---\n\n# tiny-en-de\n')
    reference = few_reference_sentences(tmp_path / "reference.txt")  # what is checked here: the card
    weights = checkpoint / "model.safetensors"
    (artefact,) = export_translation(weights, tmp_path / "artefacts", ["fp32"], reference=reference)
    exported = read_manifest(artefact)
    assert exported.trained_on == CAPTIONS

    write_manifest(artefact, exported.model_copy(update={"trained_on": None}))
    export_translation(weights, tmp_path / "artefacts", ["fp32"], reference=reference)
    assert load_and_verify(artefact) == exported
