"""Training-step speed of the main recipe's models, interleaved: the full model against the one pruned during training.

The recipe's own step clock (`prunetrain.training.metric_points`) times each run's steps as they happen, so two runs
taken one after the other also carry the machine's drift between them. Here the saved models train side by side in
one process on the same real Multi30k batches (64 sentences of similar length, as the recipe's length-grouped
sampler makes them, spread over the whole length range; the recipe's precision), the arms
interleaved in rotating order, so drift cancels: speed-up = median full / median pruned step time, with the
FLOP-ideal speed-up (matmul FLOPs of one training step, forward + backward) beside it.

    python benchmarks/bench_recipe_train_speed.py checkpoints/wmt-small-deen-full/full checkpoints/wmt-small-deen/pruned \
        --data-dir ../shared/data/multi30k              # benchmarks/results/recipe_train_speed.json
"""

from __future__ import annotations

import _common as C
import torch
from bench_midtrain_shrink import Trainer

from prunetrain import find_heads
from prunetrain.bench import alternate, compare_times, summarize
from prunetrain.bench.flops import count_flops


def main() -> None:
    p = C.parser(__doc__.splitlines()[0], repeats=10, warmup=2)
    p.add_argument("models", nargs="+", help="model directories: the reference first (e.g. full, then pruned)")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--num-batches", type=int, default=8)
    p.add_argument("--steps", type=int, default=4, help="training steps per timed call")
    p.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto")
    p.add_argument("--attn", choices=["eager", "sdpa"], default="eager", help="attention kernel (the recipe: eager)")
    C.add_device_option(p)
    args = p.parse_args()
    busy = C.wait_for_idle(args.wait_idle) if args.wait_idle else None
    if args.threads:
        torch.set_num_threads(args.threads)

    from prunetrain.mt.text.data import build_dataset, load_tokenizer, make_collator, read_parallel
    from prunetrain.mt.evaluation.translation import find_tokenizer_dir, load_translation_model
    from prunetrain.utils.device import use_bf16

    tokenizer = load_tokenizer(find_tokenizer_dir(args.models[0]))
    pairs = read_parallel(args.data_dir, "train", limit=args.batch * args.num_batches * (1 if args.quick else 4))
    device = C.chosen_device(args)
    bf16 = use_bf16(args.precision, device)
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if bf16 else None
    arms, flops, heads = {}, {}, {}
    for index, directory in enumerate(args.models):
        model = load_translation_model(directory, device=device).train()
        model.set_attn_implementation(args.attn)
        dataset = build_dataset(pairs, tokenizer, max_length=128)
        collate = make_collator(tokenizer, model)
        # length-grouped batches as the recipe's sampler makes them, spread evenly over the length range
        order = sorted(range(len(dataset)), key=lambda i: len(dataset[i]["input_ids"]))
        chunks = [order[i:i + args.batch] for i in range(0, len(order) - args.batch + 1, args.batch)]
        chunks = [chunks[round(k * (len(chunks) - 1) / max(1, args.num_batches - 1))] for k in range(args.num_batches)]
        batches = [collate([dataset[i] for i in chunk]).to(device) for chunk in chunks]
        name = f"{index}:{find_heads(model).total_heads}heads"
        trainer = Trainer(model, torch.optim.AdamW(model.parameters(), lr=1e-5), batches, autocast)

        def run(trainer=trainer) -> None:
            for _ in range(args.steps):
                trainer.step()

        arms[name] = run
        heads[name] = find_heads(model).summary()
        flops[name] = count_flops(lambda m=model, b=batches[0]: m(**b).loss.backward()).total
        model.zero_grad(set_to_none=True)
    result = alternate(arms, warmup=args.warmup, repeats=args.repeats, device=device)
    names = list(arms)
    times = {n: [t / args.steps for t in result.times[n]] for n in names}
    rows = []
    for name in names[1:]:
        cmp = compare_times(times[names[0]], times[name])
        rows.append({"arm": name, "heads": heads[name], "step_seconds": summarize(times[name]),
                     "speedup": cmp["speedup"], "speedup_pair_q1": cmp["speedup_pair_q1"],
                     "speedup_pair_q3": cmp["speedup_pair_q3"], "flop_ideal": flops[names[0]] / flops[name]})
    out = {"models": args.models, "reference": names[0], "reference_step_seconds": summarize(times[names[0]]),
           "reference_heads": heads[names[0]], "batch": args.batch, "precision": "bf16" if bf16 else "fp32",
           "device": C.device_label(device),
           "attn_implementation": args.attn, "threads": torch.get_num_threads(), "repeats": args.repeats, "steps_per_call": args.steps,
           "busy_at_start": busy, "command": C.command_line(), "rows": rows}
    path = C.output_path(args, "recipe_train_speed")
    print(f"reference {names[0]}: {out['reference_step_seconds']['median']:.3f} s/step")
    print("| arm | heads | s/step (median) | speed-up (IQR of pairs) | FLOP-ideal |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['arm']} | {r['heads']} | {r['step_seconds']['median']:.3f} | {r['speedup']:.3f} "
              f"({r['speedup_pair_q1']:.3f}–{r['speedup_pair_q3']:.3f}) | {r['flop_ideal']:.3f} |")
    C.write_json(path, out)


if __name__ == "__main__":
    main()
