"""Training speed and memory per rank before and after a mid-training shrink under DDP, beside one process.

    python benchmarks/bench_ddp_shrink.py                       # one process: results/ddp_shrink_w1.json
    torchrun --nproc_per_node 2 benchmarks/bench_ddp_shrink.py --single benchmarks/results/ddp_shrink_w1.json
                                                                # 2 ranks: results/ddp_shrink_w2.json, both arms
    ... --quick                                                 # tiny settings: checks the script, not a result

The setting and what is reported: `benchmarks/_dist_shrink.py`. Under DDP every rank holds the whole model, so the
memory per rank falls as in one process; the step time also pays the gradient all-reduce, which shrinks with the
parameters. After the shrink DDP's reducer (gradient buckets) is rebuilt for the new shapes
(`prunetrain.training.distributed.rebuild_ddp`), as `HeadPruningCallback` does. Take the numbers on a quiet machine
(FACTS.md: other load makes CPU timings pathological); torchrun gives each rank one thread.
"""

import time

import _common as C
import _dist_shrink as D
from torch.nn.parallel import DistributedDataParallel

from prunetrain.training.distributed import rebuild_ddp


def wrap(model):
    if D.world()[1] == 1:
        return model, lambda: None
    ddp = DistributedDataParallel(model)
    return ddp, lambda: rebuild_ddp(ddp)


def main() -> None:
    parser = C.parser(__doc__.splitlines()[0], repeats=1, warmup=2)
    D.add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.batch, args.len, args.steps_before, args.steps_after, args.warmup = 8, 16, 3, 3, 1
    started = time.time()
    machine = C.setup(args)
    arm = D.run("DDP" if D.world()[1] > 1 else "one process", args, wrap)
    D.report("ddp_shrink" + ("_quick" if args.quick else ""), arm, args, machine, started)
    D.finish()


if __name__ == "__main__":
    main()
