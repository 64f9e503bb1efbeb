"""What a model was trained on (the manifest's ``trained_on``), read from its model card.

One source of truth per checkpoint: the card that documents it. Our checkpoints' cards
(export/checkpoints/<name>/MODEL_CARD.md) open with YAML front matter holding a one-line
``trained_on``, so the sentence a user reads in ``/v1/models`` and the playground is the one the
card's reader sees, kept next to the weights and edited with them. A Hugging Face directory's
``README.md`` is its model card: its front matter's ``datasets`` list (Hugging Face's own key) is
what it names. A card without front matter, or naming neither, gives None: better no claim than a
guessed one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

OUR_CARD = "MODEL_CARD.md"
HUGGING_FACE_CARD = "README.md"
_FENCE = "---"


class ModelCardError(ValueError):
    """A model card whose front matter cannot be read; the message names the file."""


def trained_on(checkpoint: Path) -> str | None:
    """The domain and data ``checkpoint`` (a weights file or its directory) was trained on, from
    its directory's model card; None when the card does not say."""
    directory = checkpoint if checkpoint.is_dir() else checkpoint.parent
    ours = directory / OUR_CARD
    if ours.is_file():
        value = front_matter(ours).get("trained_on")
        if value is not None and not (isinstance(value, str) and value.strip()):
            raise ModelCardError(f"{ours}: trained_on must be a non-empty line of text, not {value!r}")
        return value.strip() if isinstance(value, str) else None
    hugging_face = directory / HUGGING_FACE_CARD
    if hugging_face.is_file():
        datasets = front_matter(hugging_face).get("datasets")
        if isinstance(datasets, str):
            datasets = [datasets]
        if isinstance(datasets, list) and (names := [str(d) for d in datasets if str(d).strip()]):
            return "datasets named by its model card: " + ", ".join(names)
    return None


def front_matter(card: Path) -> dict[str, Any]:
    """The YAML mapping between the ``---`` lines that open ``card``; {} when it opens otherwise."""
    lines = card.read_text(encoding="utf-8").splitlines()
    if not lines or lines[0].strip() != _FENCE:
        return {}
    try:
        end = next(i for i, line in enumerate(lines[1:], start=1) if line.strip() == _FENCE)
    except StopIteration:
        raise ModelCardError(f"{card}: front matter opened with --- but never closed") from None
    try:
        matter = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError as e:
        raise ModelCardError(f"{card}: unreadable front matter ({e})") from e
    if matter is None:
        return {}
    if not isinstance(matter, dict):
        raise ModelCardError(f"{card}: front matter is not a mapping of keys to values")
    return matter
