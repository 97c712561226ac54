"""Training speed and memory per rank before and after a mid-training shrink under FSDP2, beside one process.

    python benchmarks/bench_fsdp_shrink.py                      # one process: results/fsdp_shrink_w1.json
    torchrun --nproc_per_node 2 benchmarks/bench_fsdp_shrink.py --single benchmarks/results/fsdp_shrink_w1.json
                                                                # 2 ranks: results/fsdp_shrink_w2.json, both arms
    ... --quick                                                 # tiny settings: checks the script, not a result

The setting and what is reported: `benchmarks/_dist_shrink.py`. Every encoder and decoder layer and the root are
`fully_shard`-ed, so each rank holds 1/W of the parameters and of the AdamW state; the shrink gathers each affected
attention parameter and its state, slices them and shards them again (`prunetrain.engine.sharded`), so the memory
per rank falls by the share one process saves, divided over the ranks. Take the numbers on a quiet machine
(FACTS.md); torchrun gives each rank one thread.
"""

import time

import _common as C
import _dist_shrink as D
from torch.distributed.fsdp import fully_shard


def wrap(model):
    if D.world()[1] > 1:
        for layer in [*model.model.encoder.layers, *model.model.decoder.layers]:
            fully_shard(layer)
        fully_shard(model)
    return model, lambda: None


def main() -> None:
    parser = C.parser(__doc__.splitlines()[0], repeats=1, warmup=2)
    D.add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.batch, args.len, args.steps_before, args.steps_after, args.warmup = 8, 16, 3, 3, 1
    started = time.time()
    machine = C.setup(args)
    arm = D.run("FSDP2" if D.world()[1] > 1 else "one process", args, wrap)
    D.report("fsdp_shrink" + ("_quick" if args.quick else ""), arm, args, machine, started)
    D.finish()


if __name__ == "__main__":
    main()
