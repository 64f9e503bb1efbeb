"""Train the Transformer on a parallel corpus with the paper's recipe; resumable.

    python -m export.training.train --data-dir path/to/data/multi30k --work-dir runs/en-de --epochs 30

Adam(β1=0.9, β2=0.98, ε=1e-9), lr = peak · min(step/warmup, √(warmup/step)) (the paper's
inverse-square-root schedule with its scale made explicit), label smoothing 0.1, dropout 0.1,
token-budget batches of length-sorted pairs. Each epoch: validation loss and greedy sacreBLEU,
an epoch checkpoint, ``best.safetensors`` when validation BLEU improves, and ``state.pt`` so a
rerun of the same command resumes where it stopped. ``--average-last N`` finally averages the
last N epoch checkpoints into ``averaged.safetensors`` (its validation scores in
``averaged.json``), also when ``--max-minutes`` stopped the run.

``--encoder-layers`` and ``--decoder-layers`` set the two depths apart (a deep encoder with a
shallow decoder costs little more to serve: the encoder runs once per sentence, the decoder once
per output token); ``--attention-dropout`` and ``--activation-dropout`` regularise inside the
attention and the feed-forward networks. ``--max-minutes M`` starts no epoch that the longest one
so far would carry past M minutes, so a bounded call (a GPU lent by the minute) ends with its
state saved and the same command resumes it.

``--rdrop α`` adds R-Drop (Liang et al., 2021), a regulariser for small corpora: each batch runs
twice with independent dropout masks, and the loss adds α times the symmetric KL divergence
between the two predicted distributions. ``--init-from`` starts from a trained checkpoint (its
architecture and the tokenizer beside it; a fresh optimiser; ``--dropout`` applies), and
``--schedule-from N`` starts the learning-rate schedule at step N, e.g. where that run ended:

    python -m export.training.train --data-dir path/to/data/multi30k --work-dir runs/en-de-ft \
        --init-from export/checkpoints/transformer-en-de/model.safetensors --schedule-from 10260 \
        --dropout 0.3 --rdrop 1 --epochs 4 --max-tokens 3072 --lr 8e-4 --bf16
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import sacrebleu
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from tqdm import tqdm

from export.sources.ours.checkpoint import average_checkpoints, load_state, read_config, save_checkpoint
from export.sources.ours.data import (
    Batch,
    encode_source,
    encode_target,
    read_parallel,
    token_batches,
    train_tokenizer,
)
from export.sources.ours.model import Transformer, TransformerConfig
from export.sources.ours.translate import translate_ids
from export.training.state import Run, keep_epoch, resume


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def inverse_sqrt(step: int, warmup: int) -> float:
    step = max(step, 1)
    return float(min(step / warmup, (warmup / step) ** 0.5))


def label_smoothed_loss(
    logits: torch.Tensor, target: torch.Tensor, pad_id: int, smoothing: float
) -> torch.Tensor:
    """Summed cross-entropy against (1-ε)·one-hot + ε/V, ignoring padding."""
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)).float(),
        target.reshape(-1),
        ignore_index=pad_id,
        label_smoothing=smoothing,
        reduction="sum",
    )


def consistency_loss(
    logits_a: torch.Tensor, logits_b: torch.Tensor, target: torch.Tensor, pad_id: int
) -> torch.Tensor:
    """R-Drop's term: (KL(p_a ‖ p_b) + KL(p_b ‖ p_a)) / 2 summed over the non-padding positions,
    p_a and p_b the distributions of two passes of the same batch under different dropout masks."""
    log_a, log_b = logits_a.float().log_softmax(-1), logits_b.float().log_softmax(-1)
    kl = F.kl_div(log_a, log_b, log_target=True, reduction="none") + F.kl_div(
        log_b, log_a, log_target=True, reduction="none"
    )  # (…, V): KL(p_b ‖ p_a) + KL(p_a ‖ p_b)
    return (kl.sum(-1) * (target != pad_id)).sum() / 2


def training_loss(
    model: Transformer, batch: Batch, smoothing: float, rdrop: float, bf16: bool
) -> tuple[torch.Tensor, float]:
    """(the objective per target token, to minimise; the batch's summed label-smoothed loss, to
    report). With R-Drop the batch runs twice in one forward pass, each copy with its own dropout
    masks, and the objective is the mean of the copies' losses plus ``rdrop`` times their
    consistency term."""
    copies = 2 if rdrop else 1
    device = batch.src.device
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(batch.src.repeat(copies, 1), batch.tgt_in.repeat(copies, 1))
    pad = model.cfg.pad_id
    loss = label_smoothed_loss(logits, batch.tgt_out.repeat(copies, 1), pad, smoothing)
    objective = loss
    if rdrop:
        first, second = logits.chunk(2)
        objective = loss + rdrop * consistency_loss(first, second, batch.tgt_out, pad)
    return objective / (copies * batch.n_tokens), loss.item() / copies


@torch.no_grad()
def evaluate(
    model: Transformer,
    tokenizer: Tokenizer,
    src_ids: list[list[int]],
    tgt_ids: list[list[int]],
    references: Sequence[str],
    max_tokens: int,
    beam_size: int = 1,
) -> dict[str, float]:
    model.eval()
    device = next(model.parameters()).device
    total, n_tokens = 0.0, 0
    for batch in token_batches(src_ids, tgt_ids, max_tokens, model.cfg.pad_id):
        batch = batch.to(device)
        logits = model(batch.src, batch.tgt_in)
        total += float(
            F.cross_entropy(
                logits.reshape(-1, logits.size(-1)),
                batch.tgt_out.reshape(-1),
                ignore_index=model.cfg.pad_id,
                reduction="sum",
            )
        )
        n_tokens += batch.n_tokens
    hyps = tokenizer.decode_batch(translate_ids(model, src_ids, beam_size=beam_size, batch_size=128))
    bleu = sacrebleu.corpus_bleu(hyps, [list(references)])
    return {"loss": total / n_tokens, "bleu": bleu.score}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m export.training.train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data-dir", type=Path, required=True, help="holds train.{en,de}[.gz], val.{en,de}[.gz]")
    p.add_argument("--work-dir", type=Path, required=True, help="checkpoints, tokenizer, state.pt, log")
    p.add_argument("--src-lang", default="en")
    p.add_argument("--tgt-lang", default="de")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    p.add_argument("--encoder-layers", type=int, help="default: --layers (a deep encoder is cheap to serve)")
    p.add_argument("--decoder-layers", type=int, help="default: --layers (each runs once per output token)")
    p.add_argument(
        "--norm-first", action="store_true", help="pre-LN layers (trains deep stacks; default: post-LN)"
    )
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--attention-dropout", type=float, default=0.0, help="on the attention weights")
    p.add_argument(
        "--activation-dropout", type=float, help="after the feed-forward ReLU (default: --dropout)"
    )
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--rdrop", type=float, default=0.0, help="R-Drop weight α (0: off; the paper's NMT: 5)")
    p.add_argument("--max-tokens", type=int, default=4096, help="padded tokens per batch")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate, reached at --warmup")
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--schedule-from", type=int, default=0, help="the learning-rate schedule's first step")
    p.add_argument(
        "--init-from",
        type=Path,
        help="start from this checkpoint (its architecture, the tokenizer beside it)",
    )
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--average-last", type=int, default=0, help="average the last N epoch checkpoints")
    p.add_argument("--keep-last", type=int, default=5, help="epoch checkpoints kept on disk")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--bf16", action="store_true", help="bfloat16 autocast (about 1.4x faster on AVX-512 CPUs)"
    )
    p.add_argument("--limit", type=int, default=0, help="use only the first N training pairs (smoke runs)")
    p.add_argument(
        "--max-minutes",
        type=float,
        default=0.0,
        help="stop after the last epoch predicted to end within M minutes of this run (state.pt "
        "resumes it); 0: no limit",
    )
    return p.parse_args(argv)


@dataclass(frozen=True)
class Corpus:
    """The pairs as token ids, with the tokenizer and the validation targets' text (sacreBLEU's
    references) that validation needs."""

    tokenizer: Tokenizer
    train_src: list[list[int]]
    train_tgt: list[list[int]]
    val_src: list[list[int]]
    val_tgt: list[list[int]]
    references: list[str]


def vocabulary(args: argparse.Namespace, work: Path, texts: list[str]) -> Tokenizer:
    """The run's tokenizer, kept in ``work``: the one already there (a resumed run), the one beside
    --init-from's checkpoint, else one trained on ``texts``."""
    tok_path = work / "tokenizer.json"
    if tok_path.exists():
        return Tokenizer.from_file(str(tok_path))
    if args.init_from:
        tokenizer = Tokenizer.from_file(str(args.init_from.parent / "tokenizer.json"))
    else:
        tokenizer = train_tokenizer(texts, args.vocab_size)
    tokenizer.save(str(tok_path))
    return tokenizer


def model_config(args: argparse.Namespace, tokenizer: Tokenizer) -> TransformerConfig:
    """--init-from's architecture with this run's dropouts, else the one the options describe."""
    dropouts = {
        "dropout": args.dropout,
        "attention_dropout": args.attention_dropout,
        "activation_dropout": args.activation_dropout,
    }
    if args.init_from:
        return replace(read_config(args.init_from), **dropouts)
    return TransformerConfig(
        vocab_size=tokenizer.get_vocab_size(),
        d_model=args.d_model,
        n_heads=args.heads,
        d_ff=args.d_ff,
        n_encoder_layers=args.encoder_layers or args.layers,
        n_decoder_layers=args.decoder_layers or args.layers,
        max_len=args.max_len,
        norm_first=args.norm_first,
        **dropouts,
    )


def prepare_data(args: argparse.Namespace, work: Path) -> tuple[Corpus, TransformerConfig]:
    """The pairs read (the first --limit of training's), their vocabulary, the model's
    configuration, and the pairs encoded to fit its ``max_len``."""
    train_src, train_tgt = read_parallel(args.data_dir, "train", args.src_lang, args.tgt_lang)
    val_src, val_tgt = read_parallel(args.data_dir, "val", args.src_lang, args.tgt_lang)
    if args.limit:
        train_src, train_tgt = train_src[: args.limit], train_tgt[: args.limit]
    tokenizer = vocabulary(args, work, train_src + train_tgt)
    cfg = model_config(args, tokenizer)
    limit = cfg.max_len - 1
    corpus = Corpus(
        tokenizer,
        encode_source(tokenizer, train_src, limit),
        encode_target(tokenizer, train_tgt, limit),
        encode_source(tokenizer, val_src, limit),
        encode_target(tokenizer, val_tgt, limit),
        val_tgt,
    )
    return corpus, cfg


def build(args: argparse.Namespace, cfg: TransformerConfig, device: torch.device) -> Run:
    """The model (--init-from's weights, else fresh ones), Adam and the inverse-square-root
    schedule, shifted to start at --schedule-from."""
    model = Transformer(cfg).to(device)
    if args.init_from:
        model.load_state_dict(load_state(args.init_from))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: inverse_sqrt(s + args.schedule_from, args.warmup)
    )
    return Run(cfg, model, optimizer, scheduler, device)


def train_epoch(run: Run, args: argparse.Namespace, corpus: Corpus, epoch: int) -> tuple[float, int]:
    """One pass over the training pairs in batches shuffled anew each epoch: (the summed
    label-smoothed loss, the target tokens it is over)."""
    run.model.train()
    seed = args.seed * 1000 + epoch
    batches = list(
        token_batches(corpus.train_src, corpus.train_tgt, args.max_tokens, run.cfg.pad_id, seed=seed)
    )
    train_loss, train_tokens = 0.0, 0
    bar = tqdm(batches, desc=f"epoch {epoch}", unit="batch", mininterval=10)
    for batch in bar:
        batch = batch.to(run.device)
        objective, loss = training_loss(run.model, batch, args.label_smoothing, args.rdrop, args.bf16)
        run.optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(objective)
        run.optimizer.step()
        run.scheduler.step()
        train_loss += loss
        train_tokens += batch.n_tokens
        bar.set_postfix(loss=f"{train_loss / train_tokens:.3f}", lr=f"{run.scheduler.get_last_lr()[0]:.2e}")
    return train_loss, train_tokens


def validate(run: Run, args: argparse.Namespace, corpus: Corpus) -> dict[str, float]:
    """The model's validation loss and greedy sacreBLEU as it stands."""
    return evaluate(
        run.model, corpus.tokenizer, corpus.val_src, corpus.val_tgt, corpus.references, args.max_tokens
    )


def train(run: Run, args: argparse.Namespace, corpus: Corpus, work: Path, deadline: float | None) -> None:
    """The epochs after the last one done up to --epochs, each kept as it ends; with a ``deadline``
    (on time.monotonic()), none that the longest epoch so far would carry past it."""
    longest_epoch = max((h.get("epoch_seconds", 0.0) for h in run.history), default=0.0)
    for epoch in range(run.epoch + 1, args.epochs + 1):
        if deadline is not None and time.monotonic() + longest_epoch > deadline:
            print(
                f"stopped before epoch {epoch}: the longest epoch so far ({longest_epoch:.0f} s) would end "
                f"after --max-minutes {args.max_minutes:g}; rerun the same command to resume",
                flush=True,
            )
            break
        t0 = time.time()
        train_loss, train_tokens = train_epoch(run, args, corpus, epoch)
        train_time = time.time() - t0
        metrics = validate(run, args, corpus)
        epoch_time = time.time() - t0
        longest_epoch = max(longest_epoch, epoch_time)
        record = {
            "epoch": epoch,
            "train_loss": train_loss / train_tokens,
            "val_loss": metrics["loss"],
            "val_bleu_greedy": metrics["bleu"],
            "train_seconds": round(train_time, 1),
            "epoch_seconds": round(epoch_time, 1),
            "tokens_per_second": round(train_tokens / train_time),
            "step": run.scheduler.last_epoch,
            "lr": run.scheduler.get_last_lr()[0],
        }
        run.history.append(record)
        print(json.dumps(record), flush=True)
        keep_epoch(run, work, epoch, metrics["bleu"], args.keep_last)


def average_last(run: Run, args: argparse.Namespace, corpus: Corpus, work: Path) -> None:
    """averaged.safetensors of the last --average-last epoch checkpoints, its validation scores in
    averaged.json. Also when --max-minutes stopped the run: the last epochs of a bounded run
    average as well, and a resumed run overwrites the average when it stops again or ends."""
    last = sorted(work.glob("epoch*.safetensors"))[-args.average_last :] if args.average_last else []
    if not last:
        return
    run.model.load_state_dict(average_checkpoints(last))
    save_checkpoint(run.model, work / "averaged.safetensors")
    metrics = validate(run, args, corpus)
    averaged = {
        "averaged": [p.name for p in last],
        "val_loss": metrics["loss"],
        "val_bleu_greedy": metrics["bleu"],
    }
    (work / "averaged.json").write_text(json.dumps(averaged, indent=1))
    print(json.dumps(averaged), flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    deadline = time.monotonic() + args.max_minutes * 60 if args.max_minutes else None
    if args.threads:
        torch.set_num_threads(args.threads)
    seed_everything(args.seed)
    work: Path = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    corpus, cfg = prepare_data(args, work)
    run = build(args, cfg, torch.device(args.device))
    resume(run, work / "state.pt")
    n_params = sum(p.numel() for p in run.model.parameters()) / 1e6
    pairs = len(corpus.train_src)
    print(f"{n_params:.1f}M parameters, vocab {cfg.vocab_size}, {pairs} pairs, device {run.device}")
    train(run, args, corpus, work, deadline)
    average_last(run, args, corpus, work)


if __name__ == "__main__":
    main()
