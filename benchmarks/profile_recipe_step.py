"""Where the main recipe's training step spends its time, at 144, 108/72 (masked) and 72/36 (shrunk) heads, in bf16
autocast and fp32: what shrinks with the heads and what does not.

The model is the recipe's (Marian 6+6, d_model 256, 8 heads of 32, FFN 1024, eager attention, AdamW, gradient
clipping at 1.0, a tokenizer of 8000 trained on Multi30k) with random weights (the work of a step does not depend on
the weights' values), trained on the same real Multi30k batches of 64 sentences (length-grouped as the recipe's
sampler makes them). Arms:
- `144`: the full model;
- `108 masked`, `72 masked`: the full model with a `HeadMask` attached (what the recipe trains between a prune and
  the next shrink: the masked heads are still computed, the mask multiplies their output by 0);
- `72 shrunk`, `36 shrunk`: heads removed; 36 is the main job's final layout
  (recipes/results/wmt-small-deen-study/small-steps-cooldown-s0/layout.json), 72 keeps half of every site;
- `144+ffn50`, `36+ffn50`, `36+ffn25` (shrunk): FFN neurons removed too, every FFN keeping the first half (or
  quarter) of its neurons, with all heads or the 36-head layout (which neurons go does not change the work).
Each step is timed in three parts (forward, backward, optimizer: clipping + AdamW + zero_grad), interleaved over the
arms in rotating order, medians over `--repeats` rounds; one more step per arm runs under torch.profiler, whose aten
self times are summed by category (matmul, attention softmax, layer norm, embedding, loss and log-softmax,
optimizer element-wise ops, copies and reshapes, other) — the profiler slows small ops, so read its shares, not its
absolute times. FLOP-ideal: matmul FLOPs of the full step over the arm's (`prunetrain.bench.count_flops`).

`--layout PATH` adds arms from a trained run's `layout.json` (e.g. the fast recipe's final architecture, whose
FFNs keep 331–648 neurons each): `run` keeps its heads and per-layer FFN widths (the step its last stretch trains),
`run ffn/M` (for each M of `--layout-multiples`, default 64) the same heads with every FFN width rounded to the
nearest multiple of M (at least M): whether widths that are not a multiple of the CPU's or GPU's matmul tile cost
more than their FLOPs (each arm's FLOP-ideal is against its own FLOPs, so the rounding's few neurons more or less
do not count).

`--plain-records` adds, beside every shrunk arm, the same model with its config's prunetrain records held as plain
lists, dicts and tuples — what `shrink` left on a config before `prunetrain.engine.config_records`: transformers
deep-copies the config twice in every forward of this model, and plain records cost one Python call per kept unit.

`--variants` chooses what the step adds around the model, as LOSS+OPTIMIZER (several, comma-separated, are
interleaved with the arms in one run, each arm's speed taken against the 144-head step of its own variant):
`model+adamw` (the default; the model's own cross-entropy, given the labels, and AdamW: what benchmarks/README.md k
was measured with) or what the recipe's Trainer runs: loss `trainer` calls the model without labels, casts its
logits to fp32 (accelerate does this to a model's outputs under mixed precision) and applies transformers'
`LabelSmoother` (ε = 0.1, the recipe's `train.label_smoothing`); loss `fused` does the same with one
`torch.nn.functional.cross_entropy(..., label_smoothing=0.1)` (the same loss: (1 − ε)·NLL + ε·mean over the
vocabulary of −log p, averaged over the label tokens); optimizer `fused` is the Trainer's default
`adamw_torch_fused` (`torch.optim.AdamW(fused=True)`). `--arms` times a subset of the arms.

On CUDA (`--device cuda`) each part is timed from an idle GPU to an idle GPU, and the shares are of the step's GPU
kernel time, each kernel counted for the aten op that launched it; `kernels` is how many the step launched, and `gpu
busy` the profiled step's kernel time over the median unprofiled step (not over the profiled step, whose launches the
profiler slows): far below 1, the step waits on the CPU launching kernels, and fewer heads cannot make it faster.

    python benchmarks/profile_recipe_step.py --threads 2 --wait-idle 600   # benchmarks/results/recipe_step_profile.json
    python benchmarks/profile_recipe_step.py --threads 2 --precisions bf16 --arms "144,36 shrunk" \
        --variants model+adamw,trainer+fused,fused+fused
    python benchmarks/profile_recipe_step.py --quick                        # smoke run
    python benchmarks/profile_recipe_step.py --device cuda --precisions bf16 --batch 256 --d-model 512 --ffn-dim 2048
"""

from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path

import _common as C
import torch

from prunetrain import HeadMask, find_heads
from prunetrain.bench import count_flops
from prunetrain.engine.config_records import RECORD_PREFIX

REPO = Path(__file__).resolve().parents[1]
LAYOUT = REPO / "recipes/results/wmt-small-deen-study/small-steps-cooldown-s0/layout.json"
DATA = REPO.parent / "shared/data/multi30k"
ARMS = ("144", "108 masked", "72 masked", "72 shrunk", "36 shrunk", "144+ffn50", "36+ffn50", "36+ffn25")
LOSSES = ("model", "trainer", "fused")
LABEL_SMOOTHING = 0.1  # the recipe's train.label_smoothing
CATEGORIES = {
    "matmul": ("addmm", "aten::mm", "bmm", "baddbmm", "matmul", "linear"),
    "loss": ("nll_loss", "cross_entropy", "log_softmax", "gather", "masked_fill", "neg"),  # before softmax
    "softmax": ("softmax",),
    "layer norm": ("layer_norm",),
    "embedding": ("embedding",),
    "optimizer": ("_foreach", "addcdiv", "lerp", "sqrt", "clamp", "norm", "add_", "mul_", "div_"),
    "copies": ("copy_", "contiguous", "cat", "index", "clone", "to_copy", "_to_copy", "fill_", "zero_", "empty"),
}


def category(op: str) -> str:
    return next((name for name, keys in CATEGORIES.items() if any(k in op for k in keys)), "other")


def arms(model) -> dict:
    kept36 = {s["name"]: s["num_heads"] for s in json.loads(LAYOUT.read_text())["sites"]}

    def removal(counts) -> HeadMask:
        return HeadMask.from_heads(model, {s.name: range(counts(s), s.num_heads) for s in find_heads(model)})

    def masked(counts):
        clone = copy.deepcopy(model)
        removal(counts).attach(clone)
        return clone

    def shrunk(counts, ffn_keep: float = 1.0):
        return C.shrunk_to(model, lambda site: counts(site) if site.unit == "heads"
                           else round(ffn_keep * site.num_heads))

    return {"144": model, "108 masked": masked(lambda s: 6), "72 masked": masked(lambda s: 4),
            "72 shrunk": shrunk(lambda s: 4), "36 shrunk": shrunk(lambda s: kept36[s.name]),
            "144+ffn50": shrunk(lambda s: 8, 0.5), "36+ffn50": shrunk(lambda s: kept36[s.name], 0.5),
            "36+ffn25": shrunk(lambda s: kept36[s.name], 0.25)}


def layout_arms(model, layout: Path, multiples=(64,)) -> dict:
    """`run` and `run ffn/M` (module docstring): `model` shrunk to the heads and FFN widths of `layout`, and the same
    with every FFN width rounded to a multiple of each M of `multiples` (which units stay does not change the work)."""
    sites = {s["name"]: s["num_heads"] for s in json.loads(layout.read_text())["sites"]}

    def shrunk(width):
        return C.shrunk_to(model, lambda site: sites[site.name] if site.unit == "heads"
                           else min(width(sites[site.name]), site.num_heads))

    return {"run": shrunk(lambda width: width),
            **{f"run ffn/{m}": shrunk(lambda width, m=m: C.round_width(width, m)) for m in multiples}}


def plain(value):
    """A record with every `AtomList` / `AtomDict` / `AtomTuple` in it a plain list / dict / tuple again."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return (tuple if isinstance(value, tuple) else list)(plain(item) for item in value)
    return value


def with_plain_records(model):
    """A copy of shrunk `model` whose config holds its prunetrain records as plain containers (`--plain-records`)."""
    clone = copy.deepcopy(model)
    state = vars(clone.config)
    for key in [key for key in state if key.startswith(RECORD_PREFIX)]:
        state[key] = plain(state[key])
    return clone


def outside_loss(loss: str):
    """The loss the step computes outside the model (module docstring): None for "model" (the model's own
    cross-entropy), transformers' `LabelSmoother` for "trainer", the library's `SmoothedCrossEntropy` for "fused"."""
    if loss == "model":
        return None
    if loss == "trainer":
        from transformers.trainer_pt_utils import LabelSmoother

        return LabelSmoother(epsilon=LABEL_SMOOTHING)
    from prunetrain.training.loss import SmoothedCrossEntropy

    return SmoothedCrossEntropy(LABEL_SMOOTHING)


def step_loss(model, batch: dict, loss_fn, autocast) -> torch.Tensor:
    """The training loss of one batch: the model's own (`loss_fn` None), or `loss_fn` on the fp32 logits of a call
    without labels, as the recipe's Trainer (under accelerate's mixed precision) computes it."""
    if loss_fn is None:
        with autocast:
            return model(**batch).loss
    with autocast:
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    return loss_fn({"logits": logits.float()}, batch["labels"])  # .float(): accelerate's convert_outputs_to_fp32


class Step:
    """One arm: the model, AdamW (`fused`: torch's fused kernel), its batches (on the model's device), the loss
    of `outside_loss(loss)`; `run()` trains one step and returns (forward, backward, optimizer) seconds, on CUDA each from an
    idle GPU to an idle GPU."""

    def __init__(self, model, batches, bf16: bool, loss: str = "model", fused: bool = False):
        self.model, self.batches, self.bf16, self.loss_fn, self.i = model.train(), batches, bf16, outside_loss(loss), 0
        self.device = next(model.parameters()).device
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=fused or None)

    def run(self) -> tuple[float, float, float]:
        batch = self.batches[self.i % len(self.batches)]
        self.i += 1
        start = C.device_clock(self.device)
        loss = step_loss(self.model, batch, self.loss_fn,
                         torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16))
        forward = C.device_clock(self.device)
        loss.backward()
        backward = C.device_clock(self.device)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        end = C.device_clock(self.device)
        return forward - start, backward - forward, end - backward


def profile_step(step: Step) -> dict[str, float]:
    """Shares of one profiled step by op category: of its CPU time on a CPU (aten self times, the rest "outside
    aten"), of its GPU kernel time on CUDA (each kernel for the aten op that launched it), with `kernel_s` (that
    time in seconds) and `kernels` (launches) beside them."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = step.device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        start = C.device_clock(step.device)
        step.run()
        wall = C.device_clock(step.device) - start
    shares = dict.fromkeys([*CATEGORIES, "other"], 0.0)
    kernels = 0
    for event in prof.key_averages():
        if event.device_type != DeviceType.CPU:  # a kernel itself: counted, its time already with its aten op
            kernels += event.count
        elif not event.key.startswith(("[", "ProfilerStep", "Optimizer")):
            shares[category(event.key)] += (event.self_device_time_total if cuda else event.self_cpu_time_total) / 1e6
    if not cuda:
        shares["outside aten (Python, hooks)"] = max(wall - sum(shares.values()), 0.0)
        return {k: v / wall for k, v in shares.items()}
    kernel_s = sum(shares.values())
    return {**{k: v / kernel_s for k, v in shares.items()}, "kernel_s": kernel_s, "kernels": kernels}


def recipe_model_and_batches(batch: int, num_batches: int, data_dir: Path = DATA, **widths):
    """The recipe's model (random weights, eager attention) and `num_batches` real Multi30k batches of `batch`
    sentences, length-grouped as the recipe's sampler makes them and spread over the range of lengths. `widths`
    (`d_model`, `ffn_dim`) override the recipe's widths: `d_model=512, ffn_dim=2048` is its GPU setting."""
    from transformers import MarianMTModel

    from prunetrain.mt.text.data import build_dataset, make_collator, marian_config, read_parallel, train_tokenizer

    pairs = read_parallel(data_dir, "train")
    tokenizer = train_tokenizer(pairs, vocab_size=8000)
    torch.manual_seed(0)
    model = MarianMTModel(marian_config(tokenizer, attn_implementation="eager", **widths))
    dataset = build_dataset(pairs[: batch * num_batches * 8], tokenizer, max_length=128)
    order = sorted(range(len(dataset)), key=lambda i: len(dataset[i]["input_ids"]))
    chunks = [order[i:i + batch] for i in range(0, len(order) - batch + 1, batch)]
    chunks = [chunks[round(k * (len(chunks) - 1) / max(1, num_batches - 1))] for k in range(num_batches)]
    collate = make_collator(tokenizer, model)
    return model, [collate([dataset[i] for i in chunk]) for chunk in chunks]


def main() -> None:
    p = C.parser(__doc__.splitlines()[0], repeats=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--num-batches", type=int, default=6)
    p.add_argument("--d-model", type=int, default=256, help="model width (the recipe's: 256; its GPU setting: 512)")
    p.add_argument("--ffn-dim", type=int, default=1024, help="feed-forward width (the recipe's: 1024; GPU: 2048)")
    p.add_argument("--precisions", type=lambda text: text.split(","), default=["bf16", "fp32"],
                   help="comma-separated, of bf16 (autocast) and fp32 (default: both)")
    p.add_argument("--data-dir", type=Path, default=DATA, help=f"the Multi30k directory (default {DATA})")
    p.add_argument("--variants", type=lambda text: text.split(","), default=["model+adamw"],
                   help="comma-separated LOSS+OPTIMIZER, LOSS of model, trainer, fused and OPTIMIZER of adamw, fused "
                        "(module docstring; default model+adamw)")
    p.add_argument("--arms", type=lambda text: text.split(","), default=list(ARMS),
                   help=f"comma-separated, of {', '.join(ARMS)} (default: all)")
    p.add_argument("--layout", type=Path, default=None,
                   help="a trained run's layout.json: adds the arms `run` and `run ffn/M` (module docstring)")
    p.add_argument("--layout-multiples", type=lambda text: [int(m) for m in text.split(",")], default=[64],
                   help="comma-separated multiples M for the `run ffn/M` arms of --layout (default 64)")
    p.add_argument("--plain-records", action="store_true",
                   help="also time every shrunk arm with its config's records as plain lists (module docstring)")
    C.add_device_option(p)
    args = p.parse_args()
    if not args.precisions or set(args.precisions) - {"bf16", "fp32"}:
        p.error(f"--precisions {','.join(args.precisions)!r} is not allowed: a comma-separated list of bf16, fp32")
    if args.layout is not None and not args.layout.is_file():
        p.error(f"--layout {str(args.layout)!r} is not allowed: the path of a run's layout.json")
    if any(m < 1 for m in args.layout_multiples):
        p.error(f"--layout-multiples {args.layout_multiples!r} is not allowed: positive whole numbers")
    if "144" not in args.arms or set(args.arms) - set(ARMS):
        p.error(f"--arms {','.join(args.arms)!r} is not allowed: a comma-separated list of {', '.join(ARMS)} "
                f"that holds 144 (the speeds are against it)")
    for variant in args.variants:
        loss, _, optimizer = variant.partition("+")
        if loss not in LOSSES or optimizer not in ("adamw", "fused"):
            p.error(f"--variants: {variant!r} is not allowed: LOSS+OPTIMIZER with LOSS one of {', '.join(LOSSES)} "
                    f"and OPTIMIZER adamw or fused")
    C.quiet_transformers()
    env = C.setup(args)
    device = C.chosen_device(args)
    model, batches = recipe_model_and_batches(args.batch, 2 if args.quick else args.num_batches, args.data_dir,
                                              d_model=args.d_model, ffn_dim=args.ffn_dim)
    model, batches = model.to(device), [batch.to(device) for batch in batches]
    models = {name: m for name, m in arms(model).items() if name in args.arms}
    if args.layout is not None:
        models.update(layout_arms(model, args.layout, args.layout_multiples))
    if args.plain_records:
        models.update({f"{name} plain": with_plain_records(m) for name, m in list(models.items()) if "shrunk" in name
                       or "+" in name})
    flops = {name: count_flops(lambda m=m: m(**batches[0]).loss.backward()).total for name, m in models.items()}
    for m in models.values():
        m.zero_grad(set_to_none=True)
    results = {}
    for precision in args.precisions:
        steps = {}
        for variant in args.variants:
            loss, _, optimizer = variant.partition("+")
            for name, m in models.items():
                steps[(variant, name)] = Step(m if len(args.variants) == 1 else copy.deepcopy(m), batches,
                                              precision == "bf16", loss, optimizer == "fused")
        for step in steps.values():
            step.run()
        parts = {key: [] for key in steps}
        keys = list(steps)
        for r in range(2 if args.quick else args.repeats):
            for key in keys[r % len(keys):] + keys[: r % len(keys)]:
                for _ in range(len(batches)):  # every batch once per round: the same work for every arm
                    parts[key].append(steps[key].run())
        for (variant, name), step in steps.items():
            medians = [statistics.median(p[k] for p in parts[(variant, name)]) for k in range(3)]
            row = results[(precision, variant, name)] = {
                "forward_s": medians[0], "backward_s": medians[1], "optimizer_s": medians[2], "step_s": sum(medians),
                "flop_ideal": flops["144"] / flops[name], "heads": find_heads(step.model).total_heads,
                "profile_shares": profile_step(step)}
            if device.type == "cuda":
                row["profile_shares"]["gpu busy"] = row["profile_shares"]["kernel_s"] / sum(medians)
    tail = "kernels / gpu busy" if device.type == "cuda" else "outside"
    print(f"\n{'precision':9} {'variant':14} {'arm':15} {'step s':>7} {'fwd':>6} {'bwd':>6} {'optim':>6} "
          f"{'speed':>6} {'ideal':>6}  "
          f"profile shares ({' / '.join([*CATEGORIES, 'other', tail])})")
    for (precision, variant, name), row in results.items():
        full = results[(precision, variant, "144")]
        print(f"{precision:9} {variant:14} {name:15} {row['step_s']:7.4f} {row['forward_s']:6.4f} "
              f"{row['backward_s']:6.4f} {row['optimizer_s']:6.4f} {full['step_s'] / row['step_s']:6.2f} "
              f"{row['flop_ideal']:6.2f}  "
              + " / ".join(f"{v}" if isinstance(v, int) else f"{v:.2f}" for k, v in row["profile_shares"].items()
                           if k != "kernel_s"))
    suffix = "" if device.type == "cpu" else f"_{device.type}_b{args.batch}_d{args.d_model}"
    if args.variants != ["model+adamw"]:
        suffix += "_" + "_".join(args.variants)
    if args.plain_records:
        suffix += "_plain_records"
    if args.layout is not None:
        suffix += "_layout"
    C.write_json(C.output_path(args, "recipe_step_profile" + suffix), {
        "command": C.command_line(), **env, "device": C.device_label(device), "threads": torch.get_num_threads(),
        "batch": args.batch, "d_model": args.d_model, "ffn_dim": args.ffn_dim, "variants": args.variants,
        "results": [{"precision": p, "variant": v, "arm": n, **row} for (p, v, n), row in results.items()]})


if __name__ == "__main__":
    main()
