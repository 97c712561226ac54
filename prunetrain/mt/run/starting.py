"""What a translation run starts from and distils from, when it compresses a trained model.

- `model.init_from`: a finished translation run (its `full/`) or a saved model directory. The run builds the recipe's
  model (its sizes, dropout and attention implementation) and loads every weight of the trained one into it
  (`load_state_dict(strict=True)`), so training continues from that model rather than from a fresh initialisation:
  pruning during that continued training compresses it. Refused, before the run directory is touched: a model with
  fewer heads than the recipe's (start from the full model), and a config that differs from the recipe's in any
  field that changes the function (layers, widths, heads, vocabulary, normalisation, positions, ...): a silently
  different model is never trained. The run's tokenizer is the starting model's own.
- `distill.teacher`: the teacher a run distils from (`prunetrain.training.distillation.DistillationCallback`): by
  default a frozen copy of the model the run starts from, taken before the first step (saved with every checkpoint,
  restored on resume); or a given trained model (a run directory or model directory), loaded again on resume. Its
  tokenizer must be the run's: the KL compares distributions over the same token ids.

`run_tokenizer_dir(recipe)` names where the run's tokenizer comes from (the starting model's, else the teacher's, else
None: trained on the data), so the from-scratch arm that distils from a trained teacher speaks the teacher's
vocabulary.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from torch import nn

from prunetrain.engine.heads import LAYOUT_CONFIG_KEY
from prunetrain.engine.modeling_prunetrain import SPEC_KEY
from prunetrain.utils.validate import short_repr

# config fields that do not change what the model computes in training or evaluation (dropout is set by the recipe)
_FREE_FIELDS = frozenset({
    "_name_or_path", "transformers_version", "architectures", "dtype", "torch_dtype", "dropout",
    "attention_dropout", "activation_dropout", "_attn_implementation", "attn_implementation",
    "_attn_implementation_autoset", "output_attentions", "output_hidden_states", "use_cache", "return_dict",
})
# the head layout a saved config records: a starting model's is checked on its layout file (every head), a teacher's
# may be any (a pruned teacher teaches too; a scratch arm's student has fewer heads than its full teacher)
_HEAD_FIELDS = frozenset({LAYOUT_CONFIG_KEY, SPEC_KEY})


def _model_dir(path: str, key: str) -> Path:
    """The model directory a recipe key names: a finished run's `full/`, or a model directory itself."""
    from prunetrain.engine.model_dir import check_model_dir

    source = Path(path)
    for candidate in (source / "full", source):
        if (candidate / "config.json").is_file():
            if candidate != source:
                _check_finished_run(source, key)
            return check_model_dir(candidate, key)
    pruned = " (it has pruned/ only: start from a run with pruning off)" if (source / "pruned").is_dir() else ""
    raise ValueError(f"{key}: {path!r} holds no trained full model (no full/config.json or config.json){pruned}; "
                     f"train one first (`prunetrain recipe wmt-small-deen --set 'pruning.schedule_steps={{}}' --set "
                     f"'pruning.shrink_steps=[]' --output checkpoints/wmt-small-deen-full`).")


def _check_finished_run(source: Path, key: str) -> None:
    """A run directory named by a recipe key must hold a finished run: the `full/` of an unfinished one may be
    left from before it was interrupted (a resumed run writes it again), or not be the run's final model."""
    from prunetrain.mt.run.run_dir import COMPLETE_MARKER, RUN_KIND, RUN_MARKER, is_complete
    from prunetrain.utils.output_paths import read_marker

    marker = read_marker(source)
    is_run = (marker is not None and marker["kind"] == RUN_KIND) or (source / RUN_MARKER).is_file()
    if is_run and not is_complete(source):
        raise ValueError(f"{key}: {str(source)!r} is an unfinished run (no {COMPLETE_MARKER}); finish it with "
                         f"--resume, or give a finished run or a saved model directory.")


def starting_model_dir(recipe) -> Path | None:
    """The trained model `model.init_from` names (checked file by file), or None for a fresh initialisation."""
    return _model_dir(recipe.model.init_from, "model.init_from") if recipe.model.init_from else None


def teacher_model_dir(recipe) -> Path | None:
    """The trained teacher `distill.teacher` names, or None (no distillation, or the snapshot of the start)."""
    return _model_dir(recipe.distill.teacher, "distill.teacher") if recipe.distill.teacher else None


def run_tokenizer_dir(recipe) -> Path | None:
    """Where the run's tokenizer comes from: the starting model's, else a given teacher's, else None (trained on
    the data). With both, they must be one tokenizer."""
    from prunetrain.mt.evaluation.translation import find_tokenizer_dir

    start, teacher = starting_model_dir(recipe), teacher_model_dir(recipe)
    if start is not None and teacher is not None and _digest(find_tokenizer_dir(start)) != \
            _digest(find_tokenizer_dir(teacher)):
        raise ValueError(f"distill.teacher: {recipe.distill.teacher!r} has another tokenizer than model.init_from "
                         f"{recipe.model.init_from!r}; the teacher's distribution must be over the run's token ids.")
    chosen = start if start is not None else teacher
    return None if chosen is None else find_tokenizer_dir(chosen)


def _digest(tokenizer_dir: Path) -> str:
    return hashlib.sha256((tokenizer_dir / "tokenizer.json").read_bytes()).hexdigest()


def check_fits_recipe(recipe, model_dir: Path, key: str, built_config, *, full: bool) -> None:
    """Refuse a trained model whose config differs from the model the recipe builds (`built_config`) in a field
    that changes the function, or (for a starting model, `full`) that has lost heads."""
    from prunetrain.engine.heads import HeadLayout
    from prunetrain.engine.model_dir import config_dict
    from prunetrain.engine.persist import LAYOUT_FILE
    from prunetrain.mt.config.recipe import original_heads_of
    from prunetrain.utils.files import read_json

    layout = model_dir / LAYOUT_FILE  # every saved model records its heads; a pruned one has fewer
    total = original_heads_of(recipe.model)
    if full and layout.is_file():
        try:
            kept = HeadLayout.from_dict(read_json(layout, key)).total_heads
        except (KeyError, TypeError) as err:
            raise ValueError(f"{key}: {str(layout)!r} is not a prunetrain head layout ({err}).") from None
        if kept < total:
            raise ValueError(f"{key}: {str(model_dir)!r} is a pruned model ({kept} of {total} heads); start from "
                             f"the full model (every head), which the run then prunes.")
    saved = type(built_config).from_dict(config_dict(model_dir, key)).to_dict()  # defaults filled in as built
    wanted = built_config.to_dict()
    differ = sorted(k for k in set(saved) | set(wanted)
                    if k not in _FREE_FIELDS | _HEAD_FIELDS and saved.get(k) != wanted.get(k))
    if differ:
        shown = ", ".join(f"{k}: {short_repr(saved.get(k))} (the recipe's model: {short_repr(wanted.get(k))})"
                          for k in differ[:4])
        raise ValueError(f"{key}: {str(model_dir)!r} is not the recipe's model ({shown}); set the model section "
                         f"to the trained model's sizes.")


def load_starting_model(recipe, built: nn.Module) -> nn.Module:
    """`built` (the recipe's model, fresh) with every weight of `model.init_from` loaded into it; returns it."""
    import torch

    from prunetrain.mt.evaluation.translation import load_translation_model

    model_dir = starting_model_dir(recipe)
    check_fits_recipe(recipe, model_dir, "model.init_from", built.config, full=True)
    trained = load_translation_model(model_dir)
    with torch.no_grad():
        built.load_state_dict(trained.state_dict(), strict=True)
    return built


def load_teacher(recipe, built_config) -> nn.Module | None:
    """The given teacher (`distill.teacher`), frozen in eval mode; None for the snapshot or no distillation. It may
    be pruned (a smaller trained model teaches too); its other fields must be the recipe's."""
    from prunetrain.mt.evaluation.translation import load_translation_model

    model_dir = teacher_model_dir(recipe)
    if model_dir is None:
        return None
    check_fits_recipe(recipe, model_dir, "distill.teacher", built_config, full=False)
    return load_translation_model(model_dir).eval().requires_grad_(False)


def distillation_callback(recipe, built_config):
    """The `DistillationCallback` of the recipe's `distill` section, or None when it distils nothing."""
    d = recipe.distill
    if not d.enabled:
        return None
    from prunetrain.training.distillation import DistillationCallback

    return DistillationCallback(teacher=load_teacher(recipe, built_config), alpha=d.alpha, temperature=d.temperature,
                                hidden_weight=d.hidden_weight)


def check_trained_models(recipe, tokenizer) -> None:
    """The starting model (`model.init_from`) and a given teacher (`distill.teacher`) against the model the recipe
    builds with this tokenizer, and loaded (weights complete and finite: `check_loads`), before the run directory is
    touched (`prunetrain.mt.run.starting`)."""
    from prunetrain.mt.text.data import marian_config

    m = recipe.model
    config = marian_config(tokenizer, d_model=m.d_model, ffn_dim=m.ffn_dim, layers=m.layers, heads=m.heads,
                           dropout=m.dropout, attn_implementation=m.built_attention)
    for key, model_dir in (("model.init_from", starting_model_dir(recipe)), ("distill.teacher",
                                                                           teacher_model_dir(recipe))):
        if model_dir is not None:
            check_fits_recipe(recipe, model_dir, key, config, full=key == "model.init_from")
            check_loads(model_dir, key)


def check_loads(model_dir: Path, key: str) -> None:
    """Load the model `key` names as the run will, and drop it: every tensor present, of its dtype and finite
    (`prunetrain.engine.model_dir.load_model_dir`), before the run directory is touched (a run `--overwrite` would
    replace stays in place when the weights are damaged)."""
    from prunetrain.engine.model_dir import load_model_dir

    load_model_dir(model_dir, argument=key)


def distillation_record(recipe, out_dir: Path) -> dict:
    """The `distillation` entry of `results.json`: the settings, the teacher and its forward FLOPs (counted apart
    from the training FLOPs: `prunetrain.training.distillation`)."""
    d = recipe.distill
    from prunetrain.utils.files import read_json

    path = out_dir / "prunetrain" / "distillation.json"
    written = read_json(path, "run") if path.is_file() else {}
    return {"alpha": d.alpha, "temperature": d.temperature, "hidden_weight": d.hidden_weight,
            "teacher": teacher_label(recipe), "teacher_forward_flops": written.get("teacher_forward_flops")}


def distilled_loss(callbacks, loss, label_smoothing: float):
    """The Trainer's `compute_loss_func` with a `DistillationCallback` among `callbacks`: where the Trainer computes
    the loss itself (`loss`, e.g. the torchrun recipe's; or `SmoothedCrossEntropy` for label smoothing), the
    callback's `loss_func` adds the teacher's terms to it. Else `loss` as it is (the model's own loss: the callback
    combines it in the forward)."""
    from prunetrain.training.distillation import DistillationCallback

    distill = next((c for c in callbacks if isinstance(c, DistillationCallback)), None)
    if distill is None:
        return loss
    from prunetrain.training.loss import trainer_loss

    loss = trainer_loss(label_smoothing, loss)
    return distill.loss_func(loss) if loss is not None else None


def sequence_level_pairs(recipe, pairs: tuple, tokenizer, out_dir: Path, progress) -> tuple[tuple, dict | None]:
    """The run's data with the training pairs of sequence-level distillation (`distill.targets` teacher or both;
    `prunetrain.mt.text.sequence_distillation`): the teacher (`distill.teacher`, else the starting model) translates
    the training sources once, kept in `distill.translations_dir` or the run directory and read back on resume.
    Returns (pairs, the record for `results.json` `sequence_distillation`), or (pairs, None) for the references."""
    d = recipe.distill
    if not d.sequence_level:
        return pairs, None
    from prunetrain.mt.evaluation.translation import load_translation_model
    from prunetrain.mt.text.sequence_distillation import distilled_pairs, distilled_targets
    from prunetrain.utils.device import default_device

    model_dir = teacher_model_dir(recipe) or starting_model_dir(recipe)
    device = default_device() if d.engine == "transformers" else "cpu"
    teacher = load_translation_model(model_dir, device=device).eval().requires_grad_(False)
    directory = Path(d.translations_dir) if d.translations_dir else out_dir / "prunetrain" / "teacher_translations"
    train = pairs[0]
    made = distilled_targets(teacher, tokenizer, [source for source, _ in train], directory, num_beams=d.beams,
                             engine=d.engine, progress=progress)
    max_length_ratio = d.max_length_ratio or None  # 0 in the recipe: no filter
    trained_on = distilled_pairs(train, made.translations, d.targets, max_length_ratio)
    left_out = len(train) * (2 if d.targets == "both" else 1) - len(trained_on)
    record = {**made.record, "targets": d.targets, "teacher": str(model_dir), "training_pairs": len(trained_on),
              "max_length_ratio": max_length_ratio, "left_out_by_length_ratio": left_out}
    filtered = f" ({left_out} out of proportion to their sources left out)" if max_length_ratio else ""
    progress(f"sequence-level distillation: the teacher {model_dir} translated {made.record['translated_now']} and "
             f"read back {made.record['read_back']} of {len(train)} training sources ({d.engine}, beam {d.beams}; "
             f"{made.record['seconds'] / 60:.1f} teacher minutes in all); the run trains on "
             f"{'its translations' if d.targets == 'teacher' else 'the references and its translations'}{filtered}")
    return (trained_on, *pairs[1:]), record


def teacher_label(recipe) -> str:
    """How the report names the teacher."""
    if recipe.distill.teacher:
        return f"the trained model {recipe.distill.teacher}"
    return f"a frozen copy of the starting model {recipe.model.init_from} (taken before the first step)"


__all__ = ["check_fits_recipe", "check_trained_models", "distillation_callback", "distillation_record", "distilled_loss", "load_starting_model", "load_teacher", "run_tokenizer_dir", "sequence_level_pairs",
           "starting_model_dir", "teacher_label", "teacher_model_dir"]
