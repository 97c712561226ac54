"""The sets a recipe run is scored on, and what it keeps of them.

Test BLEU at the points of training is reported; validation BLEU at the same points (`eval.valid`) is what settings
are chosen on, so a comparison never picks a schedule by the score it then reports. The final model is scored on
validation, the main test split and `eval.more_test_splits` (e.g. Multi30k's test 2017 flickr and mscoco), and each
set's hypotheses and BLEU statistics are kept (`final_translations/SPLIT.json`; `test_translations.json` for the main
test split): a study then re-scores its runs, or tests two runs pairwise on any set, without their models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable


def load_test_sets(recipe, data_dir: str | None = None) -> dict[str, list]:
    """{split: pairs} of `eval.more_test_splits`, read like the main test split (a missing split is refused in one
    line naming the splits the directory has, before the run directory is touched)."""
    from prunetrain.mt.text import data as D

    cfg = recipe.data
    if cfg.hf_dataset:
        return {name: D.load_hf_parallel(cfg.hf_dataset, split=name, src=cfg.src, tgt=cfg.tgt)
                for name in recipe.eval.more_test_splits}
    from prunetrain.mt.text.corpus import multi30k_dir

    directory = Path(data_dir or cfg.dir or multi30k_dir())
    sets = {}
    for name in recipe.eval.more_test_splits:
        try:
            sets[name] = D.read_parallel(directory, name, cfg.src, cfg.tgt)
        except ValueError as error:
            raise ValueError(f"eval.more_test_splits: {name!r} cannot be read: {error}") from None
    return sets


def points_metric(recipe, inputs) -> Callable:
    """The metric of the test points: test BLEU and chrF (`bleu`, `chrf`) and, with `eval.valid`, validation BLEU
    and chrF of the same model with the same beam (`valid_bleu`, `valid_chrf`), so that choices are made on
    validation at the same compute as the test scores reported."""
    from prunetrain.mt.evaluation.metrics import bleu_metric

    ev = recipe.eval
    settings = dict(batch_size=ev.batch_size, num_beams=ev.num_beams, autocast_bf16=inputs.bf16)
    test = bleu_metric(inputs.tokenizer, inputs.test_pairs, **settings)
    valid = bleu_metric(inputs.tokenizer, inputs.valid_pairs, **settings) if inputs.valid_pairs is not None else None

    def metric(model) -> dict:
        scores = test(model)
        if valid is not None:
            on_valid = valid(model)
            scores.update(valid_bleu=on_valid["bleu"], valid_chrf=on_valid["chrf"], valid_seconds=on_valid["seconds"])
        return scores

    return metric


def score_final_sets(recipe, final: dict, inputs, progress: Callable[[str], None]) -> dict:
    """The final model on every evaluation set (`RunInputs.final_sets`: validation with `eval.valid`, the main test
    split — already decoded by `prune_and_evaluate` —, `eval.more_test_splits`), with the hypotheses and BLEU's
    per-sentence statistics kept for paired tests between runs."""
    from prunetrain.mt.evaluation.translation import evaluate_bleu

    ev = recipe.eval
    scores = {}
    for name, pairs in inputs.final_sets().items():
        if name == inputs.test_split:
            scores[name] = final["shrunk"]
            continue
        scores[name] = evaluate_bleu(final["pruned"], inputs.tokenizer, pairs, batch_size=ev.batch_size,
                                     num_beams=ev.num_beams, autocast_bf16=inputs.bf16, return_hypotheses=True,
                                     sentence_stats=True)
        if ev.print_test or name == "valid":  # eval.print_test false: no test score is printed
            progress(f"{name} BLEU of the final model: {scores[name]['bleu']:.2f}, chrF {scores[name]['chrf']:.2f} "
                     f"({len(pairs)} sentences)")
    return scores


from prunetrain.mt.comparison.compare_seeds import FINAL_TRANSLATIONS_DIR as FINAL_TRANSLATIONS  # noqa: E402 (one name for both)


def translations_record(result: dict) -> dict:
    """A final model's hypotheses on one set with its scores and BLEU's per-sentence statistics."""
    from prunetrain.methods.significance import SENTENCE_STATS

    return {"bleu": result["bleu"], "chrf": result.get("chrf"), "bleu_signature": result.get("bleu_signature"),
            "num_beams": result.get("num_beams"), "hypotheses": result.get("hypotheses"),
            SENTENCE_STATS: result.get(SENTENCE_STATS)}


def write_test_translations(out_dir: Path, result: dict) -> None:
    """The final model's test hypotheses and BLEU's per-sentence statistics (`test_translations.json`), so that
    `prunetrain compare` can test the difference between two runs' final models by paired bootstrap."""
    from prunetrain.mt.comparison.compare_arms import TRANSLATIONS_FILE

    (out_dir / TRANSLATIONS_FILE).write_text(json.dumps(translations_record(result), ensure_ascii=False))


def write_final_translations(out_dir: Path, sets: dict) -> None:
    """`final_translations/SPLIT.json` for every set the final model was scored on (`translations_record`): with
    them a study re-scores its runs, or tests them pairwise on any set, without the models."""
    folder = out_dir / FINAL_TRANSLATIONS
    folder.mkdir(exist_ok=True)
    for name, result in sets.items():
        (folder / f"{name}.json").write_text(json.dumps(translations_record(result), ensure_ascii=False))


def strip_translations(result: dict) -> dict:
    from prunetrain.methods.significance import SENTENCE_STATS

    return {k: v for k, v in result.items() if k not in ("hypotheses", SENTENCE_STATS)}


__all__ = ["FINAL_TRANSLATIONS", "load_test_sets", "points_metric", "score_final_sets", "strip_translations",
           "translations_record", "write_final_translations", "write_test_translations"]
