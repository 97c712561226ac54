"""Does the compressed model lose BLEU by saying less? Beam search's length penalty, chosen on validation
(recipes/wmt-small-deen-compress.md, "The decoding length, planned before its runs").

    .venv/bin/python scripts/length_penalty_study.py valid   every length penalty on the validation set, both arms,
                                                             five seeds; the rule's choice per arm
    .venv/bin/python scripts/length_penalty_study.py test    each arm at its chosen penalty on the three test sets,
                                                             paired tests across seeds against the starting models

The arms are the seqkd study's chosen setting (`word-lr2e-4`, checkpoints/seqkd/word-lr2e-4-sS) and its starting
models (checkpoints/compress-start/off-cooldown-sS), as saved by their runs; both are translated as the recipe's final
evaluation translates them (`evaluate_bleu`: beam `eval.num_beams`, batch `eval.batch_size`, bf16 autocast where the
run used it) with `length_penalty` added: a finished hypothesis scores its log-probability / length^lp, so lp > 1
favours longer outputs. At lp 1.0 every score must equal the one the run recorded (else the model is not the run's
and the stage stops). The rule (fixed before the first run): per arm, the penalty with the highest mean validation
BLEU over the seeds; penalties within 0.1 of the best lose to the smaller one (the closer to the recipe).
`valid` reads no test set; `test` reads the choice that `valid` wrote. Writes into
recipes/results/wmt-small-deen-seqkd/length-penalty-s0-s4/ (a stage's files are never overwritten). Run it alone.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "recipes/results/wmt-small-deen-seqkd/length-penalty-s0-s4"
DATA = REPO.parent / "shared/data/multi30k"
SEEDS = (0, 1, 2, 3, 4)
PENALTIES = (1.0, 1.3, 1.6, 2.0)
ARMS = {"word-lr2e-4": ("checkpoints/seqkd/word-lr2e-4-s{seed}",
                        "recipes/results/wmt-small-deen-seqkd/word-lr2e-4-s{seed}"),
        "start": ("checkpoints/compress-start/off-cooldown-s{seed}",
                  "recipes/results/wmt-small-deen-compress-start/off-cooldown-s{seed}")}
TIE = 0.1


def fail(message: str) -> None:
    print(f"length_penalty_study.py: {message}", file=sys.stderr)
    sys.exit(2)


def lengths(score: dict) -> dict:
    """hyp_len, ref_len and their ratio from sacreBLEU's detail line."""
    found = dict(re.findall(r"(hyp_len|ref_len) = (\d+)", score["bleu_detail"]))
    hyp, ref = int(found["hyp_len"]), int(found["ref_len"])
    return {"hyp_len": hyp, "ref_len": ref, "ratio": hyp / ref}


class Arm:
    """One arm's run at one seed: its saved final model and the scores its run recorded."""

    def __init__(self, arm: str, seed: int):
        run, kept = (REPO / p.format(seed=seed) for p in ARMS[arm])
        results = json.loads((kept / "results.json").read_text())
        self.recorded = results["final_scores"]
        self.name = f"{arm} seed {seed}"
        model_dir = run / "pruned" if (run / "pruned" / "config.json").is_file() else run / "full"
        if not (model_dir / "config.json").is_file():
            fail(f"{run} holds no saved model; train it again with its study's command first")
        from prunetrain.mt.evaluation.translation import load_model_tokenizer, load_translation_model

        self.model, self.tokenizer = load_translation_model(model_dir), load_model_tokenizer(model_dir)
        ev = results["recipe"]["eval"]
        self.settings = dict(batch_size=ev["batch_size"], num_beams=ev["num_beams"],
                             autocast_bf16=self.recorded["valid"]["autocast_bf16"])

    def score(self, split: str, pairs: list, penalty: float) -> dict:
        from prunetrain.mt.evaluation.translation import evaluate_bleu

        result = evaluate_bleu(self.model, self.tokenizer, pairs, length_penalty=penalty, **self.settings)
        if penalty == 1.0 and abs(result["bleu"] - self.recorded[split]["bleu"]) > 1e-9:
            fail(f"{self.name} translates {split} at lp 1.0 to BLEU {result['bleu']:.4f}, and its run recorded "
                 f"{self.recorded[split]['bleu']:.4f}: the saved model is not the run's")
        return {"bleu": result["bleu"], "chrf": result["chrf"], **lengths(result)}


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def choose(rows: dict) -> float:
    """The rule: the penalty with the highest mean validation BLEU; within TIE of the best, the smallest."""
    means = {lp: mean([r["bleu"] for r in rows[lp]]) for lp in rows}
    best = max(means.values())
    return min(lp for lp, m in means.items() if m >= best - TIE)


def write_new(path: Path, text: str) -> None:
    if path.exists():
        fail(f"{path} exists; a stage's record is never overwritten (move it aside to run the stage again)")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def valid_stage() -> None:
    from prunetrain.mt.text.data import read_parallel

    pairs = read_parallel(DATA, "valid")
    record = {"penalties": PENALTIES, "seeds": SEEDS, "split": "valid", "tie": TIE, "arms": {}, "chosen": {}}
    lines = ["| arm | lp | validation BLEU (mean over seeds) | chrF | output/reference length |",
             "|---|---|---|---|---|"]
    for arm in ARMS:
        rows = {lp: [] for lp in PENALTIES}
        for seed in SEEDS:
            run = Arm(arm, seed)
            for lp in PENALTIES:
                rows[lp].append(dict(run.score("valid", pairs, lp), seed=seed))
                print(f"{arm} s{seed} lp {lp}: {rows[lp][-1]}", file=sys.stderr)
        record["arms"][arm] = {str(lp): rows[lp] for lp in PENALTIES}
        record["chosen"][arm] = choose(rows)
        for lp in PENALTIES:
            lines.append(f"| {arm} | {lp} | {mean([r['bleu'] for r in rows[lp]]):.2f} | "
                         f"{mean([r['chrf'] for r in rows[lp]]):.2f} | {mean([r['ratio'] for r in rows[lp]]):.3f} |")
    lines += ["", "Chosen (validation BLEU; within 0.1 of the best, the smaller penalty): "
              + ", ".join(f"{arm} lp {lp}" for arm, lp in record["chosen"].items())]
    OUT.mkdir(parents=True, exist_ok=True)
    write_new(OUT / "validation.json", json.dumps(record, indent=1))
    write_new(OUT / "validation.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


def test_stage() -> None:
    from prunetrain.methods.seed_tests import paired_t_test, sign_flip_p
    from prunetrain.mt.text.data import read_parallel

    if not (OUT / "validation.json").is_file():
        fail("run the valid stage first: the test stage reads the penalties it chose")
    chosen = {arm: float(lp) for arm, lp in json.loads((OUT / "validation.json").read_text())["chosen"].items()}
    splits = ("test", "test_2017_flickr", "test_2017_mscoco")
    test_sets = {split: read_parallel(DATA, split) for split in splits}
    entries = {("word-lr2e-4", chosen["word-lr2e-4"]), ("start", chosen["start"]), ("start", 1.0)}
    scores = {}
    for arm in ARMS:  # each saved model loaded once, for every penalty of its arm
        penalties = sorted(lp for a, lp in entries if a == arm)
        for seed in SEEDS:
            run = Arm(arm, seed)
            for lp in penalties:
                for split, pairs in test_sets.items():
                    scores[arm, lp, seed, split] = run.score(split, pairs, lp)
    record = {"chosen": chosen, "seeds": SEEDS, "scores": [dict(arm=a, lp=lp, seed=s, split=sp, **v)
                                                         for (a, lp, s, sp), v in scores.items()], "tests": []}
    lines = ["| split | metric | word-lr2e-4 at lp | start at lp | mean Δ (compressed − start) | per seed "
             "| t-test p | sign-flip p |", "|---|---|---|---|---|---|---|---|"]
    compressed = ("word-lr2e-4", chosen["word-lr2e-4"])
    for start in sorted({("start", chosen["start"]), ("start", 1.0)}):
        for split in splits:
            for metric in ("bleu", "chrf"):
                d = [scores[(*compressed, s, split)][metric] - scores[(*start, s, split)][metric] for s in SEEDS]
                t = paired_t_test(d)
                record["tests"].append({"split": split, "metric": metric, "compressed_lp": compressed[1],
                                        "start_lp": start[1], "differences": d, "t_test": t,
                                        "sign_flip_p": sign_flip_p(d)})
                lines.append(f"| {split} | {metric} | {compressed[1]} | {start[1]} | {t['mean']:+.2f} | "
                             + ", ".join(f"{v:+.2f}" for v in d) + f" | {t['p_value']:.4f} | {sign_flip_p(d):.4f} |")
    lines += ["", "| arm | lp | split | BLEU (mean) | chrF | output/reference length |", "|---|---|---|---|---|---|"]
    for arm, lp in sorted(entries):
        for split in splits:
            rows = [scores[arm, lp, s, split] for s in SEEDS]
            lines.append(f"| {arm} | {lp} | {split} | {mean([r['bleu'] for r in rows]):.2f} | "
                         f"{mean([r['chrf'] for r in rows]):.2f} | {mean([r['ratio'] for r in rows]):.3f} |")
    write_new(OUT / "test.json", json.dumps(record, indent=1))
    write_new(OUT / "test.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    stages = {"valid": valid_stage, "test": test_stage}
    if len(sys.argv) != 2 or sys.argv[1] not in stages:
        fail(f"stage: {sys.argv[1:]!r} is not one of valid, test")
    stages[sys.argv[1]]()
