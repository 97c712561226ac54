"""Cost of Michel head importance per batch vs one training step, on a Marian model shaped like the paper's small
setting (6+6 layers, d_model 256, 8 heads, ffn 1024, vocab 8000, random weights, ~4000 target tokens per batch).

A = `head_importance(model, [batch])` (one forward + backward to the head gates, parameters frozen)
B = one AdamW training step on the same batch (forward + backward + step + zero_grad)

A and B alternate (A B A B ...) after one untimed warm-up pair, for fp32 and bf16 autocast; the medians and their ratio are
printed as a table and written to JSON. Goal: ratio A/B <= 0.7.

    python benchmarks/bench_importance.py --repeats 5 --attn sdpa,eager --out benchmarks/results/importance.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from prunetrain.methods.importance import head_importance

GOAL = 0.7


def build_model(attn: str, seed: int = 0):
    import transformers as tf

    config = tf.MarianConfig(
        vocab_size=8000, d_model=256, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
        decoder_attention_heads=8, encoder_ffn_dim=1024, decoder_ffn_dim=1024, max_position_embeddings=256,
        dropout=0.1, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=1, eos_token_id=2,
        decoder_start_token_id=1, forced_eos_token_id=None,
    )
    config._attn_implementation = attn
    torch.manual_seed(seed)
    return tf.MarianMTModel(config)


def make_batch(sentences: int, src_len: int, tgt_len: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 8000, (sentences, src_len), generator=gen)
    labels = torch.randint(3, 8000, (sentences, tgt_len), generator=gen)
    mask = torch.ones_like(ids)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench(precision: str, attn: str, batch: dict, repeats: int, warmup: int = 1) -> dict:
    dtype = torch.bfloat16 if precision == "bf16" else None
    model = build_model(attn)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def importance():
        head_importance(model, [batch], autocast=dtype)

    def train_step():
        model.train()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is not None):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):  # allocator, AdamW state
        importance(), train_step()
    a, b = [], []
    for i in range(repeats):
        a.append(timed(importance))
        b.append(timed(train_step))
        print(f"    {precision} {attn} repeat {i + 1}/{repeats}: importance {a[-1]:.3f}s, train step {b[-1]:.3f}s",
              flush=True)
    ma, mb = statistics.median(a), statistics.median(b)
    return {"precision": precision, "attn": attn, "importance_s": a, "train_step_s": b, "importance_median_s": ma,
            "train_step_median_s": mb, "ratio": ma / mb, "goal": GOAL, "meets_goal": ma / mb <= GOAL}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="untimed A B pairs before timing")
    parser.add_argument("--sentences", type=int, default=160)
    parser.add_argument("--src-len", type=int, default=25)
    parser.add_argument("--tgt-len", type=int, default=25)
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--attn", default="sdpa", help="attention implementation(s), comma-separated: sdpa,eager")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's choice; 1 is steadier on a busy shared machine)")
    parser.add_argument("--out", default="benchmarks/results/importance.json")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    batch = make_batch(args.sentences, args.src_len, args.tgt_len)
    results = []
    for attn in args.attn.split(","):
        for precision in args.precisions.split(","):
            results.append(bench(precision, attn, batch, args.repeats, args.warmup))
            r = results[-1]
            print(f"  {precision:4s} {attn:5s}: importance {r['importance_median_s']:.3f}s  train step "
                  f"{r['train_step_median_s']:.3f}s  ratio {r['ratio']:.2f}", flush=True)

    print()
    print(f"| precision | attention | importance / batch (s) | training step (s) | ratio | goal <= {GOAL} |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['precision']} | {r['attn']} | {r['importance_median_s']:.3f} | {r['train_step_median_s']:.3f} | "
              f"{r['ratio']:.2f} | {'yes' if r['meets_goal'] else 'no'} |")

    report = {
        "benchmark": "importance_vs_train_step",
        "model": "Marian 6+6 layers, d_model 256, 8 heads, ffn 1024, vocab 8000, random weights",
        "batch": {"sentences": args.sentences, "src_len": args.src_len, "tgt_len": args.tgt_len,
                  "target_tokens": args.sentences * args.tgt_len},
        "repeats": args.repeats, "warmup": args.warmup,
        "order": "alternating A (importance), B (train step) after `warmup` untimed pairs; median",
        "env": {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
                "platform": platform.platform(), "loadavg_at_end": os.getloadavg()},
        "results": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
