"""Does this machine train the recipe's model at the speed of the machine that made a study's kept timed runs?

    .venv/bin/python scripts/same_speed.py REFERENCE.json MEASURED.json [--tolerance 1.25]

Runs compared at equal wall-clock get as many steps as their machine makes in the minutes given, so a study's timed
runs must share one machine's speed: a seed made on a faster or slower CPU gets more or fewer steps than the seeds
before it. The record `prunetrain.bench.environment.machine()` keeps (CPU name, cores, bf16 instructions) can be the
same for CPUs of different speed: on 2026-12-01 a 2-core "AMD EPYC" with AVX512-BF16 (family 26) stepped the
recipe's full model in 0.46–0.53 s, where the EPYC of the fast proof's kept timed runs took 0.28–0.32 s
(benchmarks/README.md l4, l5). Both files are `benchmarks/profile_recipe_step.py` results; the step compared is the
144-head (full) model's median seconds per step in bf16 autocast, with the reference's loss and optimizer variant.

Exit 0 with one line (both steps and their ratio) when MEASURED / REFERENCE lies within [1 / tolerance, tolerance],
otherwise exit 2 with one line saying which way and by how much.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def full_model_step(path: Path, variant: str | None = None) -> tuple[float, str]:
    """The full model's bf16 seconds per step in the profile at `path` and its variant (the given one, or the
    profile's first): ValueError naming the file when it holds no such row."""
    try:
        profile = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"{path} is not a readable profile_recipe_step.py result ({error})") from None
    rows = [row for row in profile.get("results", []) if row.get("arm") == "144" and row.get("precision") == "bf16"
            and (variant is None or row.get("variant") == variant)]
    if not rows:
        raise ValueError(f"{path} holds no bf16 step of the 144-head model" + (f" with variant {variant}" if variant
                                                                              else ""))
    return float(rows[0]["step_s"]), rows[0]["variant"]


def verdict(reference_s: float, measured_s: float, tolerance: float) -> tuple[bool, str]:
    """(within, one sentence): whether measured_s / reference_s lies within [1 / tolerance, tolerance]."""
    ratio = measured_s / reference_s
    numbers = f"this machine's full-model bf16 step {measured_s:.3f} s against the reference's {reference_s:.3f} s"
    if 1 / tolerance <= ratio <= tolerance:
        return True, f"same speed: {numbers} ({ratio:.2f}×, within {tolerance}×)"
    way = "slower" if ratio > 1 else "faster"
    return False, (f"{numbers}: {max(ratio, 1 / ratio):.2f}× {way}, beyond {tolerance}×; a study's timed runs share "
                   f"one machine's speed, so make them on a machine like the reference's")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference", type=Path)
    parser.add_argument("measured", type=Path)
    parser.add_argument("--tolerance", type=float, default=1.25)
    args = parser.parse_args(argv)
    if not args.tolerance > 1:
        parser.error(f"--tolerance {args.tolerance} is not allowed: a ratio above 1 (e.g. 1.25)")
    try:
        reference_s, variant = full_model_step(args.reference)
        measured_s, _ = full_model_step(args.measured, variant)
    except ValueError as error:
        print(f"same_speed.py: {error}", file=sys.stderr)
        return 2
    within, sentence = verdict(reference_s, measured_s, args.tolerance)
    print(f"same_speed.py: {sentence}", file=sys.stdout if within else sys.stderr)
    return 0 if within else 2


if __name__ == "__main__":
    sys.exit(main())
