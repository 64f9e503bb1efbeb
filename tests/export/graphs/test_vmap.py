"""export/graphs/vmap.py: a vocabulary map from parallel text, readable by the service's shortlists."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

from export.graphs.vmap import build_vmap, main
from service.engine.translation.shortlist import VocabularyMap

PAIRS = [
    ("a dog", "ein Hund"),
    ("a cat", "eine Katze"),
    ("the dog runs", "der Hund rennt"),
    ("a dog runs", "ein Hund rennt"),
    ("the cat", "die Katze"),
]


def word_tokenizer() -> Tokenizer:
    words = sorted({w for pair in PAIRS for side in pair for w in side.split()})
    vocab = {w: i for i, w in enumerate(["<unk>", *words])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def test_each_source_token_allows_its_strongest_co_occurring_targets_first() -> None:
    lines = build_vmap(word_tokenizer(), [s for s, _ in PAIRS], [t for _, t in PAIRS], per_token=2, always=1)
    rules = dict(line.split("\t") for line in lines)
    assert rules[""] == "Hund"  # the most frequent target, in every sentence's list
    assert rules["dog"] == "Hund ein"  # dice 1.0, then 0.8
    assert rules["cat"] == "Katze die"  # dice 1.0, then 0.67 (ties broken by the token)
    assert rules["runs"].split()[0] == "rennt"


def test_the_command_writes_a_map_the_service_reads(tmp_path: Path) -> None:
    tokenizer = word_tokenizer()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "src.txt").write_text("\n".join(s for s, _ in PAIRS) + "\n", encoding="utf-8")
    (tmp_path / "tgt.txt").write_text("\n".join(t for _, t in PAIRS) + "\n", encoding="utf-8")
    argv = ["--tokenizer", str(tmp_path / "tokenizer.json"), "--source", str(tmp_path / "src.txt")]
    argv += ["--target", str(tmp_path / "tgt.txt"), "--out", str(tmp_path / "vmap.txt"), "--per-token", "1"]
    assert main([*argv, "--always", "0"]) == 0
    vmap = VocabularyMap.read(tmp_path / "vmap.txt", tokenizer.token_to_id, [0])
    shortlist = [tokenizer.id_to_token(int(i)) for i in vmap.shortlist(["the", "dog"])]
    assert sorted(shortlist) == sorted(["<unk>", "Hund", "der"])
    (tmp_path / "tgt.txt").write_text("ein Hund\n", encoding="utf-8")
    assert main([*argv, "--always", "0"]) == 1  # the files do not align
