"""The speed/quality frontier (issue 65): trained translation models as served in CTranslate2, float32 and int8, at
beam 4 — test BLEU and chrF on each test set beside sentences/s (one translator per process, free decoding) and the
speed-up over the first model (`prunetrain.mt.evaluation.frontier`). Writes JSON, a markdown table (.md) and a figure
(.png) beside each other and prints the table.

    python benchmarks/bench_frontier.py --model start=checkpoints/proof/off-cooldown-s0 \\
        --model compressed=checkpoints/compress/seq-word-s0 --data-dir ../shared/data/multi30k \\
        --splits test,test_2017_flickr,test_2017_mscoco --out benchmarks/results/frontier-s0.json
    python benchmarks/bench_frontier.py --model a=DIR --model b=DIR --quick     # 100 sentences, 1 round

A model is a model directory or a finished run directory (its pruned/, else its full/). Run it alone on the machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

import _common as C

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "multi30k"


def parse_models(values: list[str]) -> dict[str, str]:
    models = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            sys.exit(f"--model: {value!r} is not NAME=DIRECTORY.")
        if name in models:
            sys.exit(f"--model: the name {name!r} is given twice; give each model its own name.")
        models[name] = path
    return models


def main() -> None:
    p = C.parser(__doc__.split("\n\n")[0], repeats=3)
    p.add_argument("--model", action="append", default=[], metavar="NAME=DIR",
                   help="a model or run directory (repeat; the first is the reference of the speed-ups)")
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, help="parallel text: SPLIT.de / SPLIT.en files")
    p.add_argument("--splits", default="test,test_2017_flickr,test_2017_mscoco",
                   help="test splits, comma-separated (the first is also timed)")
    p.add_argument("--beams", type=int, default=4)
    p.add_argument("--limit", type=int, default=0, help="first N sentences of each split (0: all)")
    p.add_argument("--compute-types", default="float32,int8")
    args = p.parse_args()
    if not args.model:
        sys.exit("--model: give at least one NAME=DIRECTORY.")
    if args.beams < 1 or args.repeats < 1 or args.limit < 0:
        sys.exit("--beams and --repeats must be >= 1 and --limit >= 0.")
    models = parse_models(args.model)
    limit = 100 if args.quick else args.limit
    repeats = 1 if args.quick else args.repeats
    environment = C.setup(args)

    from prunetrain.mt.evaluation.frontier import frontier, frontier_figure, frontier_table
    from prunetrain.mt.text.data import read_parallel

    test_sets = {}
    for split in [s for s in args.splits.split(",") if s]:
        pairs = read_parallel(args.data_dir, split)
        test_sets[split] = pairs[:limit] if limit else pairs
    try:
        result = frontier(models, test_sets, beams=args.beams, repeats=repeats, threads=args.threads,
                          compute_types=tuple(t for t in args.compute_types.split(",") if t))
    except ValueError as err:
        sys.exit(str(err))
    result.update(machine=environment, command=C.command_line(), quick=args.quick)
    out = args.out or C.RESULTS / "frontier.json"
    C.write_json(out, result)
    table = frontier_table(result)
    out.with_suffix(".md").write_text(table + "\n")
    frontier_figure(result, out.with_suffix(".png"))
    print(table)


if __name__ == "__main__":
    main()
