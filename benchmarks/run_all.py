"""Run the issue-6 benchmarks one after another (never in parallel: they would disturb each other).

    python benchmarks/run_all.py                      # default settings, results in benchmarks/results/
    python benchmarks/run_all.py --quick              # smoke run of every script
    python benchmarks/run_all.py --threads 1 --suffix _t1 --wait-idle 300

Extra options are passed to every script (`--threads`, `--wait-idle`, `--quick`); `--suffix` is appended to each
JSON name. Prints each script's output as it comes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = {
    "bert_shrink": "bench_bert_shrink.py",
    "mt_generate": "bench_mt_generate.py",
    "hooks": "bench_hooks.py",
    "midtrain_shrink": "bench_midtrain_shrink.py",
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--wait-idle", type=float, default=0.0)
    p.add_argument("--suffix", default="")
    p.add_argument("--only", nargs="+", choices=list(SCRIPTS), default=list(SCRIPTS))
    args = p.parse_args()
    start = time.perf_counter()
    failed = []
    for name in args.only:
        cmd = [sys.executable, str(HERE / SCRIPTS[name])]
        if args.quick:
            cmd.append("--quick")
        if args.threads is not None:
            cmd += ["--threads", str(args.threads)]
        if args.wait_idle:
            cmd += ["--wait-idle", str(args.wait_idle)]
        if args.suffix:
            cmd += ["--out", str(HERE / "results" / f"{name}{args.suffix}.json")]
        print(f"\n=== {' '.join(cmd[1:])}", flush=True)
        if subprocess.call(cmd) != 0:
            failed.append(name)
    print(f"\nall done in {time.perf_counter() - start:.0f} s" + (f"; FAILED: {failed}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
