"""ONNX Runtime arm: the full model vs shrunk copies exported with `prunetrain export --format onnx`, timed in ORT.

Models (random weights; speed does not depend on the values): a BERT-base-shaped encoder (12 × 12 heads, hidden
768, `model.onnx`) and the paper's small Marian translation model (6+6 layers, d256, 8 heads; the split
`encoder_model.onnx` + `decoder_model.onnx` graphs, one encoder call then one decoder call per timed call; and greedy
generation of `--new-tokens` tokens with the KV-cache graph, `prunetrain.export.onnx.OrtGenerator`). Arms:
the original, 50 % of the heads removed in every site, and 50 % removed non-uniformly. Every arm is exported and
checked against PyTorch (max |Δ| ≤ 1e-4) before it is timed; the arms are interleaved in every round (rotating
order) with `prunetrain.bench.alternate`, speed-ups are ratios of median times (`compare_times`), and the FLOP-ideal
speed-up is the ratio of the PyTorch models' matmul FLOPs (`count_flops`).

Take the numbers on a quiet machine (nothing else running):

    python benchmarks/bench_onnx.py --threads 2 --wait-idle 600   # benchmarks/results/onnx.json
    python benchmarks/bench_onnx.py --quick                       # smoke run (tiny shapes, 2 rounds)
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import _common as C
import torch

from prunetrain.bench import alternate, compare_times, count_flops

NONUNIFORM = {"bert": ([10, 9, 8, 7, 6, 6, 6, 6, 5, 4, 3, 2], 12),  # 72 of 144 heads, like the uniform 50 %
              "marian": ([7, 6, 5, 3, 2, 1], 8)}  # 24 of 48 heads per kind


def bert(quick: bool):
    import transformers as tf

    config = tf.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128) \
        if quick else tf.BertConfig()
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return tf.BertForMaskedLM(config).eval()


def marian(quick: bool):
    model = C.marian_model(attn="eager", dropout=0.0).eval()
    if quick:
        import transformers as tf

        cfg = C.marian_config("eager", 0.0)
        cfg.encoder_layers = cfg.decoder_layers = 2
        cfg.d_model, cfg.encoder_ffn_dim, cfg.decoder_ffn_dim = 64, 128, 128
        torch.manual_seed(0)
        model = tf.MarianMTModel(cfg).eval()
    return model


def variants(model, nonuniform: list[int], full_heads: int) -> dict:
    """The original, 50 % of every site's heads removed, and 50 % removed non-uniformly (`nonuniform[layer]` of
    `full_heads` kept, scaled to the site's heads in the quick shapes)."""
    def kept(site):
        return max(1, round(nonuniform[site.layer % len(nonuniform)] * site.num_heads / full_heads))

    return {"full": copy.deepcopy(model), "-50%": C.shrunk_copy(model, C.fraction_kept(0.5), 1),
            "-50% non-uniform": C.shrunk_copy(model, kept, 2)}


def _inputs(model, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (batch, seq), generator=gen)
    return ids, torch.ones_like(ids), torch.randint(3, vocab, (batch, seq), generator=gen)


def ort_call(directory: Path, model, task: str, batch: int, seq: int, threads: int, new_tokens: int):
    """A zero-argument function running the exported graph(s) once on fixed random token inputs: `forward` (one
    call of each graph without a cache) or `greedy` (`new_tokens` tokens with the KV-cache graph)."""
    from prunetrain.export.onnx import OrtGenerator, session

    ids, mask, dec_ids = _inputs(model, batch, seq)
    if task == "greedy":
        start = model.generation_config.decoder_start_token_id
        generator = OrtGenerator(directory, threads)
        return lambda: generator.greedy(ids, mask, new_tokens, decoder_start_token_id=start)
    ids, mask, dec_ids = ids.numpy(), mask.numpy(), dec_ids.numpy()
    if getattr(model.config, "is_encoder_decoder", False):
        enc, dec = session(directory / "encoder_model.onnx", threads), session(directory / "decoder_model.onnx", threads)

        def call():
            hidden = enc.run(None, {"input_ids": ids, "attention_mask": mask})[0]
            return dec.run(None, {"decoder_input_ids": dec_ids, "encoder_hidden_states": hidden,
                                  "encoder_attention_mask": mask})
        return call
    sess = session(directory / "model.onnx", threads)
    return lambda: sess.run(None, {"input_ids": ids, "attention_mask": mask})


def torch_flops(model, task: str, batch: int, seq: int, new_tokens: int) -> int:
    """Matmul FLOPs of the same work in PyTorch (`forward`, or cached greedy `generate` of `new_tokens`)."""
    ids, mask, dec_ids = _inputs(model, batch, seq)
    with torch.inference_mode():
        if task == "greedy":
            return count_flops(lambda: model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                                      num_beams=1, max_new_tokens=new_tokens,
                                                      min_new_tokens=new_tokens, use_cache=True)).total
        kwargs = {"input_ids": ids, "attention_mask": mask}
        if getattr(model.config, "is_encoder_decoder", False):
            kwargs["decoder_input_ids"] = dec_ids
        return count_flops(lambda: model(**kwargs)).total


def run_case(name: str, model, task: str, batch: int, seq: int, threads: int, warmup: int, repeats: int,
             new_tokens: int) -> dict:
    from prunetrain.export.onnx import check_onnx, export_onnx

    arms = variants(model, *NONUNIFORM[name])
    calls, flops, heads, diffs = {}, {}, {}, {}
    keep = tempfile.TemporaryDirectory()
    for label, arm in arms.items():
        directory = Path(keep.name) / label.replace(" ", "_").replace("%", "pct")
        directory.mkdir()
        export_onnx(arm, directory)
        diffs[label] = check_onnx(arm, directory)
        calls[label] = ort_call(directory, arm, task, batch, seq, threads, new_tokens)
        flops[label] = torch_flops(arm, task, batch, seq, new_tokens)
        heads[label] = C.find_heads(arm).total_heads
        print(f"  exported {label}: {heads[label]} heads, max |ORT - PyTorch| {diffs[label]:.2e}", flush=True)
    timed = alternate(calls, warmup=warmup, repeats=repeats)
    rows = []
    for label in arms:
        stats = compare_times(timed.times["full"], timed.times[label])
        ideal = flops["full"] / flops[label]
        rows.append({"model": name, "task": task, "variant": label, "heads": heads[label], "batch": batch,
                     "seq_len": seq, "new_tokens": new_tokens if task == "greedy" else None,
                     "median_s": sorted(timed.times[label])[len(timed.times[label]) // 2],
                     "times_s": timed.times[label], "speedup": stats["speedup"],
                     "speedup_min": stats["speedup_min"], "flops": flops[label], "flop_ideal": ideal,
                     "of_ideal": (stats["speedup"] - 1) / max(ideal - 1, 1e-9) if label != "full" else None,
                     "max_abs_diff_vs_pytorch": diffs[label]})
    keep.cleanup()
    return {"order": timed.order_string(), "rows": rows}


def main() -> None:
    p = C.parser(__doc__.split("\n")[0], repeats=7)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--models", nargs="+", default=["bert", "marian"], choices=["bert", "marian"])
    p.add_argument("--new-tokens", type=int, default=16, help="tokens of the greedy (KV cache) task (Marian)")
    args = p.parse_args()
    machine = C.setup(args)
    C.quiet_transformers()
    import onnxruntime

    threads = args.threads or torch.get_num_threads()
    batch, seq = (2, 16) if args.quick else (args.batch, args.seq)
    repeats = 2 if args.quick else args.repeats
    results = {}
    for name in args.models:
        model = bert(args.quick) if name == "bert" else marian(args.quick)
        print(f"\n## {name}: ONNX Runtime {onnxruntime.__version__} CPU, batch {batch} × {seq}, fp32, "
              f"{threads} threads", flush=True)
        for task in ("forward", "greedy") if name == "marian" else ("forward",):
            new_tokens = 4 if args.quick else args.new_tokens
            results[f"{name}/{task}"] = run_case(name, model, task, batch, seq, threads, args.warmup, repeats,
                                                 new_tokens)
    print("\n| model | task | variant | heads | median (ms) | speed-up | FLOP-ideal | share of ideal | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    for result in results.values():
        for r in result["rows"]:
            share = "" if r["of_ideal"] is None else f"{r['of_ideal']:.0%}"
            print(f"| {r['model']} | {r['task']} | {r['variant']} | {r['heads']} | {r['median_s'] * 1e3:.1f} "
                  f"| {r['speedup']:.3f} | {r['flop_ideal']:.3f} | {share} | {r['max_abs_diff_vs_pytorch']:.1e} |")
    C.write_json(C.output_path(args, "onnx"), {"command": C.command_line(), "machine": machine,
                                               "onnxruntime": onnxruntime.__version__, "threads": threads,
                                               "results": results})


if __name__ == "__main__":
    main()
