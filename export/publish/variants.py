"""Publishing an artefact variant, the same way for every task: the export's last stage.

``<out_root>/<name>/<variant>/`` is written only by :func:`publish_variant`: the variant is
built in a staging directory next to its target, given a provisional manifest so that the
service's loader can open it, verified (through the service's engine, by the caller's
``verify``), given its final manifest, read back through the contract
(``service.artefacts.load_and_verify``) and only then swapped into place. A failure at any
step removes the staging directory and leaves an earlier artefact at the target untouched.

Also here, shared by the translation and the embedding export: the variant names of the
command line, the up-to-date check that lets a re-run skip finished variants (recording their
informational ``trained_on`` in place), and the fields every manifest records about the tools
that wrote it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from export.graphs.int8_rowwise import BLOCKED_QUANTIZE_OPSET
from export.graphs.onnx_tools import opset_and_ir
from export.progress import progress
from export.verify import Parity
from service.artefacts import (
    INT8_WEIGHT_BITS,
    MANIFEST_NAME,
    ArtefactError,
    Manifest,
    ReferenceCheck,
    Task,
    Variant,
    load_and_verify,
    write_manifest,
)

VARIANTS: tuple[Variant, ...] = ("fp32", "int8", "fp16")
ALL = "all"  # on the command line: every variant, also next to others ("all" + "int8" = all)

Fusions = dict[str, int]  # onnxruntime optimiser fusions / quantised op counts, per op type
# (staging directory, fusions, parity figures, reference check) → the variant's manifest
ManifestFor = Callable[[Path, Fusions, Parity, ReferenceCheck | None], Manifest]


def parse_variants(names: Iterable[str]) -> list[Variant]:
    """The requested variants in canonical order (fp32, int8, fp16), each once; ``all`` adds
    every variant. ValueError naming an unknown one."""
    wanted: set[str] = set()
    for name in names:
        if name == ALL:
            wanted.update(VARIANTS)
        elif name in VARIANTS:
            wanted.add(name)
        else:
            raise ValueError(f"unknown variant {name!r} (expected one of {', '.join(VARIANTS)} or {ALL})")
    if not wanted:
        raise ValueError("no variant requested")
    return [v for v in VARIANTS if v in wanted]


def published_manifest(
    target: Path, *, task: Task, name: str, variant: Variant, source_sha256: str, reference_sha256: str
) -> Manifest | None:
    """The manifest at ``target`` when it already holds this very export: intact (every file's
    sha256 checked), of the same task, name, variant and source weights, and measured on the
    current reference sentences (or recorded as not verifiable on CPU, where no check ran).
    None when the variant must be exported again; the caller adds its task's own conditions."""
    if not (target / MANIFEST_NAME).is_file():
        return None
    try:
        manifest = load_and_verify(target)
    except ArtefactError:
        return None
    same = (
        manifest.task == task
        and manifest.name == name
        and manifest.variant == variant
        and manifest.source.sha256 == source_sha256
    )
    check = manifest.reference_check
    measured = check is not None and check.sha256 == reference_sha256
    unverifiable = manifest.parity.get("cpu_verified") == 0.0  # fp16 the CPU provider cannot run
    # Older forms still load, but the current one is faster: an int8 graph of the per-axis form
    # (before opset 21), a CPU graph with SkipLayerNormalization (export/graphs/translation.py: build_fp32).
    # An int8 graph of 8-bit weights is wrong on CPUs without VNNI. An embedding graph returning
    # hidden states left the pooling to the service.
    current_form = (
        (manifest.variant != "int8" or manifest.opset >= BLOCKED_QUANTIZE_OPSET)
        and manifest.int8_weights_current
        and manifest.embedding_graph_current
        and (manifest.variant == "fp16" or "SkipLayerNormalization" not in manifest.fusions)
    )
    return manifest if same and current_form and (measured or unverifiable) else None


def record_trained_on(target: Path, manifest: Manifest, trained_on: str | None) -> None:
    """Write ``trained_on`` into the manifest of the up-to-date artefact at ``target`` when it
    records another (none, before the field; or the model card has been edited since): the field
    is informational, so it is brought up to date in place (the manifest is replaced atomically,
    no file it lists changes) instead of the variant being exported again."""
    if manifest.trained_on != trained_on:
        write_manifest(target, manifest.model_copy(update={"trained_on": trained_on}))
        progress(f"{target.parent.name}/{target.name}: trained_on recorded in its manifest")


def still_to_export(
    wanted: list[Variant], root: Path, up_to_date: Callable[[Variant], bool]
) -> list[Variant]:
    """The variants of ``wanted`` that are not ``up_to_date`` at ``root/<variant>``; the others
    are reported as skipped."""
    todo = [v for v in wanted if not up_to_date(v)]
    for v in wanted:
        if v not in todo:
            progress(f"{root.name}/{v}: up to date ({root / v}), skipped")
    return todo


def tool_fields(graph: Path, variant: Variant) -> dict[str, Any]:
    """The manifest fields that say what wrote and verified the artefact: the graph's opset and
    IR version, the int8 weights' bits, the onnxruntime version and the time."""
    import onnxruntime

    opset, ir_version = opset_and_ir(graph)
    return {
        "opset": opset,
        "ir_version": ir_version,
        "int8_weight_bits": INT8_WEIGHT_BITS if variant == "int8" else None,
        "onnxruntime_version": str(onnxruntime.__version__),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def publish_variant(
    target: Path,
    build: Callable[[Path], Fusions],
    manifest_for: ManifestFor,
    verify: Callable[[Path], tuple[Parity, ReferenceCheck | None]],
    *,
    publish: bool = True,
) -> None:
    """Build, verify and publish one variant at ``target`` (see the module's docstring).

    ``build`` writes the graphs and tokenizer into the staging directory and returns their
    fusion counts; ``manifest_for`` makes the manifest (with no figures yet for the provisional
    one); ``verify`` loads the staged directory as the service does and returns the figures,
    raising VerificationError when out of tolerance. ``publish`` False verifies only (fp32 as
    the baseline of the other variants when fp32 itself was not asked for)."""
    started = time.perf_counter()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.staging-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide the published artefact from other users
    try:
        fusions = build(staging)
        write_manifest(staging, manifest_for(staging, fusions, {}, None))
        parity, check = verify(staging)
        if publish:
            write_manifest(staging, manifest_for(staging, fusions, parity, check))
            load_and_verify(staging)  # the round trip the service will do
            _swap_into_place(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already when it was published
    if publish:
        progress(
            f"{target.parent.name}/{target.name}: done in {time.perf_counter() - started:.0f} s → {target}"
        )


def publish_variants(
    todo: list[Variant],
    root: Path,
    build: Callable[[Variant, Path], Fusions],
    manifest_for: Callable[[Variant, Path, Fusions, Parity, ReferenceCheck | None], Manifest],
    verify: Callable[[Variant, Path], tuple[Parity, ReferenceCheck | None]],
) -> None:
    """:func:`publish_variant` for each variant of ``todo`` at ``root/<variant>``, the callables
    taking the variant first. fp32 goes first and always: it is verified as the baseline of
    int8/fp16, and published only when ``todo`` asks for it."""
    order: list[Variant] = ["fp32", *(v for v in todo if v != "fp32")]
    for variant in order:
        progress(f"{root.name}/{variant}: exporting")
        publish_variant(
            root / variant,
            partial(build, variant),
            partial(manifest_for, variant),
            partial(verify, variant),
            publish=variant in todo,
        )


def _swap_into_place(staging: Path, target: Path) -> None:
    """Rename ``staging`` to ``target``; an earlier ``target`` is removed only afterwards."""
    old: Path | None = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
    staging.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
