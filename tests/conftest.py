"""Shared test settings: one CPU thread for torch (the machine is shared with training runs); the
tiny real artefacts that tests across the tree use, each trained or exported once per run by the
export code itself (a fixture imported into a module would be a second one, built again), for
all of pytest-xdist's workers (tests/background.py); the default models' artefacts of the e2e
and image tests, their export started as soon as collection ends; and the order of the test
files (``pytest_collection_modifyitems``).

`make test` runs the suite on two xdist workers, ``--dist loadfile --no-loadscope-reorder``: a
test file goes to one worker whole (its module fixtures built once), in the order set here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.background import built_once, config_run_folder, run_folder, stop_all

DEFAULT_ARTEFACTS = "default_artefacts"
IMAGE = "cpu_image"  # tests/deploy/conftest.py: the CPU image, built in the background


def _waits_for(item: pytest.Item) -> int:
    """0: nothing; 1: the default models' export; 2: the image (which serves them too)."""
    fixtures = getattr(item, "fixturenames", ())
    return 2 if IMAGE in fixtures else 1 if DEFAULT_ARTEFACTS in fixtures else 0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The test files that wait for a background job last, the image's after the export's, each
    file whole (xdist gives a file to one worker, in this order): the jobs run beside the other
    tests instead of before their own."""
    waits: dict[Path, int] = {}
    for item in items:
        waits[item.path] = max(waits.get(item.path, 0), _waits_for(item))
    items.sort(key=lambda item: waits[item.path])  # stable: in their order otherwise


def pytest_collection_finish(session: pytest.Session) -> None:
    """The default models' export, when a selected test serves them: started now, beside the
    tests before it (minutes on a clean clone), where pytest's cache keeps it between runs."""
    cache = getattr(session.config, "cache", None)  # absent under -p no:cacheprovider
    if session.config.option.collectonly or cache is None:
        return
    if any(DEFAULT_ARTEFACTS in getattr(item, "fixturenames", ()) for item in session.items):
        from tests.e2e.real_models import session_export

        session_export(cache.mkdir("e2e-artefacts"), config_run_folder(session.config))


def pytest_sessionfinish(session: pytest.Session) -> None:
    stop_all(session.config)


@pytest.fixture(scope="session")
def default_artefacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fp32 and int8 of the default models (tests/e2e/real_models.py), exported once."""
    from tests.e2e.real_models import session_export

    run = run_folder(tmp_path_factory.getbasetemp())
    return session_export(run / "e2e-artefacts", run).result()  # the one started, if one was


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> None:
    """Keep torch on one thread; the service tests run without torch installed."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def translation_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory with model.safetensors + tokenizer.json of a tiny trained model of ours."""
    pytest.importorskip("torch")
    from tests.tiny_models import tiny_translation_checkpoint

    return built_once(
        tmp_path_factory,
        "translation-checkpoint",
        lambda folder: tiny_translation_checkpoint(folder / "tiny-en-de"),
    )


@pytest.fixture(scope="session")
def translation_artefact(translation_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """<root>/tiny-en-de/fp32, verified against PyTorch by export_translation on a few sentences:
    its check on the committed reference set is tests/export/test_translation_export.py's."""
    from export.translation import export_translation
    from tests.tiny_models import few_reference_sentences

    def export(folder: Path) -> Path:
        reference = few_reference_sentences(tmp_path_factory.mktemp("reference") / "reference.txt")
        (directory,) = export_translation(translation_checkpoint, folder, ["fp32"], reference=reference)
        return directory

    return built_once(tmp_path_factory, "translation-fp32", export)


@pytest.fixture(scope="session")
def embedding_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BertModel in the sentence-transformers layout (mean pooling, max length 16)."""
    pytest.importorskip("transformers")
    from tests.tiny_models import tiny_bert_dir

    return built_once(
        tmp_path_factory, "embedding-source", lambda folder: tiny_bert_dir(folder / "tiny-bert")
    )


@pytest.fixture(scope="session")
def embedding_artefact(embedding_source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """<root>/tiny-bert/fp32, written and verified by export_embedding."""
    from export.embedding import export_embedding

    def export(folder: Path) -> Path:
        (directory,) = export_embedding(embedding_source, folder, ["fp32"])
        return Path(directory)

    return built_once(tmp_path_factory, "embedding-fp32", export)


@pytest.fixture(scope="session")
def translation_fp16(
    translation_checkpoint: Path, translation_artefact: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The same model's fp16 variant (float16 memory and cache), next to the fp32 one, verified
    on the same few sentences."""
    from export.translation import export_translation
    from tests.tiny_models import few_reference_sentences

    def export(_: Path) -> Path:
        reference = few_reference_sentences(tmp_path_factory.mktemp("reference") / "reference.txt")
        root = translation_artefact.parent.parent
        (directory,) = export_translation(translation_checkpoint, root, ["fp16"], reference=reference)
        return directory

    return built_once(tmp_path_factory, "translation-fp16", export)


@pytest.fixture(scope="session")
def shortlist_export(translation_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding ``identity.vmap`` (tests/tiny_models.py) and ``artefacts/tiny-en-de/``: the
    tiny model's fp32 and int8 exported with that vocabulary map, their checks (the shortlist's
    among them) on the few sentences of ``reference.txt``, there too."""
    from export.translation import export_translation
    from tests.tiny_models import few_reference_sentences, identity_vmap

    def export(root: Path) -> Path:
        vmap = identity_vmap(translation_checkpoint / "tokenizer.json", root / "identity.vmap")
        reference = few_reference_sentences(root / "reference.txt")
        export_translation(
            translation_checkpoint, root / "artefacts", ["fp32", "int8"], vmap=vmap, reference=reference
        )
        return root

    return built_once(tmp_path_factory, "shortlist", export)


@pytest.fixture(scope="session")
def shortlist_artefact(shortlist_export: Path) -> Path:
    """<root>/tiny-en-de/int8 of ``shortlist_export``: the engine tests' shortlist decoder."""
    return shortlist_export / "artefacts" / "tiny-en-de" / "int8"
