"""The decoder of each layout the export writes, chosen once when a translation artefact loads.

``per_layer_kv_slots`` (fp32, int8: the CPU variants) is decoded by ``slots.SlotDecoder``,
``per_layer_kv_positions`` (fp16, the GPU's) by ``positions.PositionsDecoder``. From then on the
engine asks the decoder class what it can do (``decoding.Decoder``), never the layout's name.
Artefacts of the layouts earlier exports wrote are refused with the command that exports them
again; ``make serve`` does so itself for the default models (service/serving/startup.py).
"""

from __future__ import annotations

from pathlib import Path

from service.artefacts import ArtefactError, Manifest, TranslationInfo, decoder_layout_of
from service.engine.translation.decoding import Decoder
from service.engine.translation.positions import PositionsDecoder
from service.engine.translation.slots import SlotDecoder

DECODERS: dict[str, type[Decoder]] = {
    "per_layer_kv_slots": SlotDecoder,
    "per_layer_kv_positions": PositionsDecoder,
}


def decoder_class(manifest: Manifest, info: TranslationInfo, directory: Path) -> type[Decoder]:
    """The decoder class of the artefact's layout, once the layout is one served and its
    decoder graph has that layout's inputs."""
    where = directory / "manifest.json"
    layout = info.decoder_layout
    decoder = DECODERS.get(layout)
    if decoder is None:
        raise ArtefactError(
            f"{where}: decoder layout {layout!r} was written by an earlier export and is no longer "
            f"served; export the model again: `python -m export {manifest.source.path} --name "
            f"{manifest.name} --out {directory.parent.parent} --variant {manifest.variant}` "
            "(`make serve` re-exports the default models itself)"
        )
    if layout != decoder_layout_of(t.name for t in manifest.graphs["decoder"].inputs):
        raise ArtefactError(f"{where}: decoder_layout {layout!r} does not match the decoder graph's inputs")
    return decoder
