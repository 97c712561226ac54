"""Recipes: YAML files in `prunetrain/mt/recipes/` (package data), validated into dataclasses when they are loaded.

Unknown keys and wrong types are errors that list what is valid; every value is range-checked by its section's
`__post_init__` and cross-field rules (a pruning fraction reachable with `min_heads_per_layer`, a pruning schedule
inside the training epochs, ...) by the recipe's, so `load_recipe` — and `prunetrain recipe X --show` — reports any
mistake, naming the recipe key, before a run touches its output directory. `--set section.key=value` overrides any
field.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from prunetrain.mt.config.recipe_budget import check_budgets
from prunetrain.mt.config.recipe_common import (  # noqa: F401 (names the recipe has always offered)
    ATTN_IMPLEMENTATIONS,
    KINDS,
    MEASURED_ATTENTIONS,
    METHODS,
    MODES,
    PRECISIONS,
    SCOPES,
    TRAIN_PRECISIONS,
    DataConfig,
    _check_counts,
    _check_fractions,
    _check_header,
    _check_number,
    _check_scheduler,
    _pruned_heads,
)
from prunetrain.mt.config.recipe_l0 import GateEvalConfig, GateSweepRecipe, GateTrainConfig, SweepConfig
from prunetrain.mt.config.recipe_yaml import build_dataclass, load_override_value, load_recipe_mapping
from prunetrain.mt.run.run_checks import check_static_limits
from prunetrain.mt.text.sequence_distillation import ENGINES as TEACHER_ENGINES
from prunetrain.mt.text.sequence_distillation import TARGETS as SEQUENCE_TARGETS
from prunetrain.training.points import check_epoch_points, check_step_points
from prunetrain.utils.validate import check_bool, check_choice, check_fraction, check_int

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"  # shipped as package data
@dataclass
class ModelConfig:
    layers: int = 6  # encoder layers = decoder layers (Michel et al. §6: 6 + 6)
    heads: int = 8  # heads per attention layer (Michel et al. §6: 8)
    d_model: int = 256  # sized for CPU; the paper-sized GPU setting is 512 / ffn 2048
    ffn_dim: int = 1024
    dropout: float = 0.1
    attn_implementation: str = "eager"  # eager + bf16 autocast trained fastest on a 2-core AVX512-BF16 CPU; measure:
    # the faster of eager and sdpa on this machine, timed on a copy of the model before training (with
    # train.precision=measure both are timed together; recorded in precision_record.json)
    init_from: str = ""  # start from a trained model instead of a fresh initialisation: a finished run directory
    # (its full/) or a saved model directory, with every head and this section's sizes; its tokenizer is the run's
    # (data.vocab_size is then not used). Pruning during continued training compresses it (prunetrain.mt.run.starting)

    def __post_init__(self):
        for key in ("layers", "heads", "d_model", "ffn_dim"):
            check_int(f"model.{key}", getattr(self, key), 1)
        if self.d_model % self.heads:
            raise ValueError(f"model.d_model: {self.d_model} is not divisible by model.heads={self.heads}; every "
                             f"head needs the same width.")
        _check_number("model.dropout", self.dropout, 0.0, 1.0, high_open=True)
        check_choice("model.attn_implementation", self.attn_implementation, ATTN_IMPLEMENTATIONS + ("measure",))

    @property
    def built_attention(self) -> str:
        """The attention the model is built with (eager until a measured one is chosen)."""
        return "eager" if self.attn_implementation == "measure" else self.attn_implementation


@dataclass
class TrainConfig:
    epochs: int = 12
    batch_size: int = 256  # sentences per step (Multi30k: about 3.5k target tokens)
    learning_rate: float = 1e-3
    warmup_steps: int = 300
    scheduler: str = "inverse_sqrt"  # a transformers lr_scheduler_type
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    max_grad_norm: float = 1.0
    precision: str = "auto"  # auto | bf16 | fp32 | measure; auto = bf16 autocast where the hardware has native bf16
    # (prunetrain.utils.device); measure = a few real training steps in each native precision on a copy of the model
    # before training, the faster one trains the run (prunetrain.bench.precision; recorded in precision_record.json)
    seed: int = 0
    max_steps: int = 0  # > 0: the run is this many optimizer steps (it overrides epochs); 0: epochs × steps/epoch
    max_flops: float = 0.0  # > 0: the run ends after the step at which its training FLOPs (matmul, forward +
    # backward, counted from every batch's shape and the model as it is) reach this budget: equal compute on any
    # machine. With max_steps also set, whichever comes first.
    cooldown: float = 0.0  # > 0: the learning rate decays linearly to zero over this last share of the FLOP
    # budget (0.2: the last 20 % of train.max_flops), or of train.max_train_minutes (prunetrain.training.cooldown)
    max_minutes: float = 0.0  # a guard only: stop gracefully after this long (0: no cap); reported when it fires
    max_train_minutes: float = 0.0  # > 0 (with max_flops 0): the run ends after the step at which its training
    # clock reaches this many minutes: steps, pruning work and data loading, not measurements (mt.recipe_budget)
    logging_steps: int = 50
    save_total_limit: int = 2

    def __post_init__(self):
        for key, minimum in (("epochs", 1), ("batch_size", 1), ("warmup_steps", 0), ("seed", 0),
                             ("logging_steps", 1), ("save_total_limit", 1), ("max_steps", 0)):
            check_int(f"train.{key}", getattr(self, key), minimum)
        _check_number("train.learning_rate", self.learning_rate, 0.0, low_open=True)
        _check_number("train.weight_decay", self.weight_decay, 0.0)
        _check_number("train.label_smoothing", self.label_smoothing, 0.0, 1.0, high_open=True)
        _check_number("train.max_grad_norm", self.max_grad_norm, 0.0)
        _check_number("train.max_minutes", self.max_minutes, 0.0)
        _check_number("train.max_flops", self.max_flops, 0.0)
        if 0 < self.max_flops < 1:
            raise ValueError(f"train.max_flops: {self.max_flops!r} is not allowed; a FLOP budget is a count of "
                             f"training FLOPs, 0 (no budget) or at least 1 (e.g. 1.78e14).")
        _check_number("train.cooldown", self.cooldown, 0.0, 1.0)
        if self.cooldown and self.max_flops and not self.cooldown * self.max_flops >= 1:
            raise ValueError(f"train.cooldown: {self.cooldown!r} of train.max_flops={self.max_flops!r} is less than "
                             f"one FLOP; the learning rate could not decay over it — give a larger share (e.g. 0.2).")
        check_choice("train.precision", self.precision, TRAIN_PRECISIONS)
        _check_scheduler("train.scheduler", self.scheduler)


@dataclass
class PruningConfig:
    importance_epochs: list[float] = field(default_factory=lambda: [1, 2, 4, 8, 12])  # record importance (epochs,
    # fractional allowed: 0.5 is the middle of the first epoch)
    importance_steps: list[int] = field(default_factory=list)  # more importance points, as global steps
    curve_epochs: list[float] = field(default_factory=lambda: [1, 2, 4, 8, 12])  # pruned-BLEU curves (Michel §6)
    curve_steps: list[int] = field(default_factory=list)  # more curve points, as global steps
    curve_relative: bool = True  # curve fractions of the heads still present (else of the original heads)
    curve_fractions: list[float] = field(default_factory=lambda: [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8])
    curve_sentences: int = 500  # first N validation sentences for the curves
    curve_random_baseline: bool = False  # also curves in random order
    importance_batches: int = 8  # fixed training batches for importance
    importance_batch_size: int = 64
    schedule: dict[float, float] = field(default_factory=dict)  # prune during training: {epoch: cumulative
    # fraction}; epochs may be fractional ({0.5: 0.25, 1.5: 0.5})
    schedule_steps: dict[int, float] = field(default_factory=dict)  # the same, keyed by global step
    ffn_schedule_steps: dict[int, float] = field(default_factory=dict)  # FFN neurons pruned during training:
    # {step: cumulative fraction of all FFN neurons}, ranked by importance over every FFN (scored in the heads'
    # backward pass); its steps may differ from schedule_steps', and shrink_steps may name either's
    ffn_multiple_of: int = 1  # every FFN keeps a multiple of this many neurons (the nearest to what its importance
    # asks, the highest-scoring stay; ServingConstraints.neurons_multiple_of), so its matmuls fit the hardware's tile:
    # e.g. 64 (benchmarks/README.md l6: odd widths stepped slower than the full model on an AMX Xeon); 1: any width
    same_heads_per_stack: bool = False  # every encoder attention keeps the same number of heads, and every decoder
    # attention (self and cross) the same, after each pruning step and the final one (ServingConstraints.
    # same_heads_per_stack): CTranslate2 runs such a model without padding heads (benchmarks/README.md j)
    mode: str = "mask"  # during-training pruning: mask | shrink
    shrink_steps: list[int] = field(default_factory=list)  # mode mask: steps of schedule_steps at which the heads
    # masked so far are removed physically (optimizer state sliced): masks first, then a mid-training shrink
    method: str = "importance"  # importance: Michel et al. scores + schedule; l0: Hard-Concrete gates (Voita §6)
    l0_target_heads: int = 36  # method l0: the head budget the gates are trained to (a Lagrangian on E[L0])
    l0_target_flops: float = 0.0  # method l0: > 0 gates heads and FFN neurons instead, to remove this share of the
    # per-token weight multiply-adds (a Lagrangian on the expected share left); 0: the head budget above
    l0_gate_lr: float = 0.1
    l0_lagrangian_lr: float = 0.05
    l0_init_log_alpha: float = 3.0
    l0_start_step: int = 600  # the gates join training after this step (from step 0 they close heads too early)
    final_fraction: float = 0.5  # pruned by importance after training, then shrunk
    scope: str = "global"  # global | layer | kind
    min_heads_per_layer: int = 1
    kept_per_kind: dict[str, int] = field(default_factory=dict)  # heads each attention kind keeps at the end of
    # the schedule ({encoder_self: 6, decoder_self: 12, cross: 18}: Voita et al.'s order), each kind ranked within
    # itself; every pruning step prunes the same share of each kind's final amount as the schedule's fraction
    init_layout: str = ""  # build the model with these per-site heads, freshly initialised (a pruned model or run
    # directory, or a prunetrain_layout.json): the same architecture trained from scratch
    init_heads: int = 0  # > 0: keep this many heads chosen at random at initialisation (min_heads_per_layer each)

    def __post_init__(self):
        check_epoch_points("pruning.importance_epochs", self.importance_epochs)
        check_step_points("pruning.importance_steps", self.importance_steps)
        check_epoch_points("pruning.curve_epochs", self.curve_epochs)
        check_step_points("pruning.curve_steps", self.curve_steps)
        _check_fractions("pruning.curve_fractions", self.curve_fractions)
        for key in ("curve_sentences", "importance_batches", "importance_batch_size"):
            check_int(f"pruning.{key}", getattr(self, key), 1)
        for key, unit in (("schedule", "epoch"), ("schedule_steps", "step"), ("ffn_schedule_steps", "step")):
            table = getattr(self, key)
            (check_epoch_points if unit == "epoch" else check_step_points)(f"pruning.{key} ({unit}s)", list(table))
            _check_fractions(f"pruning.{key}", table.values())
            amounts = [table[point] for point in sorted(table)]
            if any(later < earlier for earlier, later in zip(amounts, amounts[1:])):
                raise ValueError(f"pruning.{key}: {table!r} is not allowed; fractions are cumulative, so they must "
                                 f"not decrease from one {unit} to the next.")
        check_int("pruning.ffn_multiple_of", self.ffn_multiple_of, 1)
        if self.ffn_multiple_of > 1 and not (self.ffn_schedule_steps or self.l0_target_flops):
            raise ValueError(f"pruning.ffn_multiple_of: {self.ffn_multiple_of} rounds the widths of pruned FFNs, but "
                             f"no FFN neuron is pruned; give pruning.ffn_schedule_steps (or pruning.l0_target_flops "
                             f"with method l0), or leave it at 1.")
        check_bool("pruning.same_heads_per_stack", self.same_heads_per_stack)
        if self.same_heads_per_stack and self.kept_per_kind:
            raise ValueError(f"pruning.same_heads_per_stack: true would move the counts pruning.kept_per_kind="
                             f"{self.kept_per_kind!r} fixes for each attention kind; give one or the other.")
        check_choice("pruning.mode", self.mode, MODES)
        check_step_points("pruning.shrink_steps", self.shrink_steps)
        for step in self.shrink_steps:
            if step not in self.schedule_steps and step not in self.ffn_schedule_steps:
                both = sorted(set(self.schedule_steps) | set(self.ffn_schedule_steps))
                keys = "pruning.schedule_steps" + (" or pruning.ffn_schedule_steps" if self.ffn_schedule_steps else "")
                raise ValueError(f"pruning.shrink_steps: {step} is not a step of {keys} {both}; a shrink follows a "
                                 f"pruning step.")
        if self.ffn_schedule_steps and (self.schedule or self.kept_per_kind):
            other = "pruning.schedule (epochs)" if self.schedule else "pruning.kept_per_kind"
            raise ValueError(f"pruning.ffn_schedule_steps: {self.ffn_schedule_steps!r} goes with the heads' "
                             f"pruning.schedule_steps, not with {other}; give the heads' schedule in steps.")
        if self.shrink_steps and self.mode != "mask":
            raise ValueError(f"pruning.shrink_steps: {self.shrink_steps} needs pruning.mode=mask (mode "
                             f"{self.mode!r} already shrinks at every pruning step).")
        check_choice("pruning.method", self.method, METHODS)
        check_int("pruning.l0_target_heads", self.l0_target_heads, 1)
        _check_number("pruning.l0_target_flops", self.l0_target_flops, 0.0, 1.0, high_open=True)
        if self.l0_target_flops and self.method != "l0":
            raise ValueError(f"pruning.l0_target_flops: {self.l0_target_flops!r} needs pruning.method=l0 (method "
                             f"{self.method!r} prunes by importance; give it a FLOP target in ffn_schedule_steps).")
        _check_number("pruning.l0_gate_lr", self.l0_gate_lr, 0.0, low_open=True)
        _check_number("pruning.l0_lagrangian_lr", self.l0_lagrangian_lr, 0.0, low_open=True)
        _check_number("pruning.l0_init_log_alpha", self.l0_init_log_alpha, -20.0, 20.0)
        check_int("pruning.l0_start_step", self.l0_start_step, 0)
        check_fraction("pruning.final_fraction", self.final_fraction)
        check_choice("pruning.scope", self.scope, SCOPES)
        check_int("pruning.min_heads_per_layer", self.min_heads_per_layer, 0)
        for kind, kept in self.kept_per_kind.items():
            check_choice("pruning.kept_per_kind", kind, KINDS)
            check_int(f"pruning.kept_per_kind[{kind}]", kept, 0)
        check_int("pruning.init_heads", self.init_heads, 0)
        if self.init_layout and self.init_heads:
            raise ValueError("pruning.init_heads: set either pruning.init_layout (a recorded architecture) or "
                             "pruning.init_heads (random heads), not both.")


_SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_split_names(key: str, names) -> None:
    """A list of distinct split names, each a plain file-name stem (`test_2017_flickr`: read as
    `test_2017_flickr.{src,tgt}` and written as `final_translations/test_2017_flickr.json`)."""
    if not isinstance(names, list):
        raise ValueError(f"{key}: {names!r} is not a list of split names (e.g. [test_2017_flickr]).")
    for name in names:
        if not isinstance(name, str) or not _SPLIT_NAME.fullmatch(name) or name.endswith("."):
            raise ValueError(f"{key}: {name!r} is not a split name; give letters, digits, '_', '-' and '.' "
                             f"(e.g. test_2017_flickr).")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{key}: {repeated[0]!r} is named more than once; give each split once.")


@dataclass
class EvalConfig:
    num_beams: int = 4  # final BLEU (curves use greedy decoding)
    test_steps: list[int] = field(default_factory=list)  # test BLEU (num_beams) during training, at these steps,
    # stamped with the training-step time spent to reach them (the BLEU-vs-time curve)
    test_limit: int = 0  # score only the first N test sentences (0: all)
    batch_size: int = 50
    curve_batch_size: int = 100
    test_flops: list[float] = field(default_factory=list)  # test BLEU also where the training FLOPs first reach
    # these shares of train.max_flops (0.25: a quarter of the budget): runs compared at equal compute
    test_times: list[float] = field(default_factory=list)  # the same as shares of train.max_train_minutes
    bench: bool = True  # benchmark original vs shrunk generation at the end
    bench_repeats: int = 3
    valid: bool = False  # validation BLEU and chrF (same beam) wherever the test split is scored: at every test
    # point during training and for the final model; settings are chosen on it, never on a test set
    valid_limit: int = 0  # score only the first N validation sentences (0: all)
    more_test_splits: list[str] = field(default_factory=list)  # more test sets the final model is scored on (BLEU,
    # chrF, translations kept), each a split of the data (`SPLIT.{src,tgt}` in data.dir, or a dataset split)
    print_test: bool = True  # false: test scores are computed and written (results.json, report.md, TensorBoard)
    # but never printed: the log lines and the closing summary show validation instead (for runs that choose settings)

    def __post_init__(self):
        for key, minimum in (("num_beams", 1), ("test_limit", 0), ("batch_size", 1), ("curve_batch_size", 1),
                             ("bench_repeats", 1), ("valid_limit", 0)):
            check_int(f"eval.{key}", getattr(self, key), minimum)
        check_bool("eval.valid", self.valid)
        check_bool("eval.print_test", self.print_test)
        check_split_names("eval.more_test_splits", self.more_test_splits)
        check_step_points("eval.test_steps", self.test_steps)
        for share in self.test_flops:
            _check_number("eval.test_flops", share, 0.0, 1.0, low_open=True, high_open=True)
        if any(later <= earlier for earlier, later in zip(self.test_flops, self.test_flops[1:])):
            raise ValueError(f"eval.test_flops: {self.test_flops!r} is out of order; give increasing shares of "
                             f"train.max_flops, each once.")


@dataclass
class DistillConfig:
    """Distillation from an unpruned teacher while the model is pruned (`prunetrain.training.distillation`):
    L = (1 − α)·CE + α·T²·KL(p_T^teacher ‖ p_T^student) + β·Σ_l MSE(h_s^l, h_t^l)."""

    alpha: float = 0.0  # α, the soft term's weight (0 with hidden_weight 0: no distillation)
    temperature: float = 2.0  # T
    hidden_weight: float = 0.0  # β: per-layer hidden-state matching (CoFi), 0: off
    teacher: str = ""  # "": a frozen copy of the model the run starts from (model.init_from) taken before the first
    # step; or a finished run directory (its full/) or saved model directory with the run's tokenizer
    # sequence-level distillation (Kim & Rush 2016; prunetrain.mt.text.sequence_distillation): what the run trains on
    targets: str = "references"  # "teacher": the teacher's beam translations of the training sources; "both"
    beams: int = 4  # the teacher's beam size
    engine: str = "ctranslate2"  # the teacher translates in CTranslate2 (float32, checked) or "transformers"
    translations_dir: str = ""  # "": kept in the run directory; a shared directory lets runs reuse them (keyed)
    max_length_ratio: float = 0.0  # 0: every translation; r ≥ 1: a translation with more than r times its source's
    # words, or fewer than 1/r of them, is left out of the training pairs (repetition loops, empty outputs)

    def __post_init__(self):
        _check_number("distill.alpha", self.alpha, 0.0, 1.0)
        _check_number("distill.temperature", self.temperature, 0.0, low_open=True)
        _check_number("distill.hidden_weight", self.hidden_weight, 0.0)
        check_choice("distill.targets", self.targets, SEQUENCE_TARGETS)
        check_int("distill.beams", self.beams)
        check_choice("distill.engine", self.engine, TEACHER_ENGINES)
        if self.max_length_ratio != 0:
            _check_number("distill.max_length_ratio", self.max_length_ratio, 1.0)
            if not self.sequence_level:
                raise ValueError(f"distill.max_length_ratio: {self.max_length_ratio!r} filters the teacher's "
                                 f"translations, which distill.targets='references' does not train on; set "
                                 f"distill.targets to teacher or both, or the ratio to 0.")
        if not isinstance(self.translations_dir, str):
            raise ValueError(f"distill.translations_dir: {self.translations_dir!r} is not a path; give a directory "
                             f"or \"\" for the run directory.")

    @property
    def enabled(self) -> bool:
        """Word-level distillation (the teacher's distributions in the loss)."""
        return self.alpha > 0 or self.hidden_weight > 0

    @property
    def sequence_level(self) -> bool:
        """The run trains on the teacher's translations (alone or beside the references)."""
        return self.targets != "references"


@dataclass
class Recipe:
    """A translation recipe (kind "translation"): train, record importance and curves, prune, shrink, benchmark."""

    kind: str = "translation"
    name: str = "custom"
    description: str = ""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    pruning: PruningConfig = field(default_factory=PruningConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)

    def __post_init__(self):
        _check_header(self, "translation")
        p, m = self.pruning, self.model
        self._check_start()
        if p.min_heads_per_layer > m.heads:
            raise ValueError(f"pruning.min_heads_per_layer: {p.min_heads_per_layer} is more than model.heads="
                             f"{m.heads}.")
        late = sorted(e for e in p.schedule if e > self.train.epochs) if not self.train.max_steps else []
        late_steps = sorted(s for s in [*p.schedule_steps, *p.ffn_schedule_steps]
                            if self.train.max_steps and s > self.train.max_steps)
        if late_steps:
            raise ValueError(f"pruning.schedule_steps: step {late_steps[0]} is after the last training step "
                             f"(train.max_steps={self.train.max_steps}); that pruning step would never happen.")
        if late:
            raise ValueError(f"pruning.schedule: epoch {late[0]:g} is after the last training epoch "
                             f"(train.epochs={self.train.epochs}); that pruning step would never happen.")
        total = 3 * m.layers * m.heads
        if p.method == "l0" and p.ffn_schedule_steps:
            raise ValueError(f"pruning.ffn_schedule_steps: {p.ffn_schedule_steps!r} prunes FFN neurons by importance, "
                             f"but pruning.method=l0 lets the gates choose; gate FFN neurons with pruning.l0_target_flops.")
        if p.method == "l0" and not p.l0_target_flops and p.l0_target_heads > total:
            raise ValueError(f"pruning.l0_target_heads: {p.l0_target_heads} is more than the model's {total} heads.")
        if p.method == "l0" and self.train.max_steps and p.l0_start_step >= self.train.max_steps:
            raise ValueError(f"pruning.l0_start_step: {p.l0_start_step} is not before the last training step "
                             f"(train.max_steps={self.train.max_steps}); the gates would never train.")
        check_budgets(self)  # train.max_flops / max_train_minutes, the cooldown and test points that follow them
        self._check_kept_per_kind()
        if self.eval.valid and self.data.test_split == "valid":
            raise ValueError("data.test_split: 'valid' is the validation split, which eval.valid scores apart; name "
                             "a test split (settings are chosen on validation and reported on test).")
        clash = [s for s in self.eval.more_test_splits if s in ("train", "valid", self.data.test_split)]
        if clash:
            raise ValueError(f"eval.more_test_splits: {clash[0]!r} is the training, validation or main test split "
                             f"(data.test_split={self.data.test_split!r}); name other test sets.")
        late_tests = [s for s in self.eval.test_steps if self.train.max_steps and s > self.train.max_steps]
        if late_tests:
            raise ValueError(f"eval.test_steps: step {late_tests[0]} is after the last training step "
                             f"(train.max_steps={self.train.max_steps}); that evaluation would never happen.")
        self._check_reachable("pruning.final_fraction", [p.final_fraction])
        if p.curve_epochs or p.curve_steps:  # without a curve point no curve is drawn, whatever its fractions
            self._check_reachable("pruning.curve_fractions", p.curve_fractions)
        self._check_reachable("pruning.schedule", list(p.schedule.values()))
        self._check_reachable("pruning.schedule_steps", list(p.schedule_steps.values()))
        check_static_limits(self)  # what the run needs of this machine: seed range, attention backend, memory

    def _check_start(self) -> None:
        """What the run starts from and distils from: one starting model (a trained one, a recorded architecture or
        random heads), and a teacher that is not the fresh initialisation."""
        p, m, d = self.pruning, self.model, self.distill
        if m.init_from and (p.init_layout or p.init_heads):
            other = "pruning.init_layout" if p.init_layout else "pruning.init_heads"
            raise ValueError(f"model.init_from: {m.init_from!r} starts from a trained model, {other} from a fresh "
                             f"smaller one; set one of them.")
        if d.sequence_level and not (m.init_from or d.teacher):
            raise ValueError(f"distill.targets: {d.targets!r} trains on a teacher's translations, but there is no "
                             f"teacher: give model.init_from=<trained run> (it teaches) or distill.teacher=<trained "
                             f"run>.")
        if d.enabled and not (m.init_from or d.teacher):
            raise ValueError(f"distill.alpha: {d.alpha!r} (hidden_weight {d.hidden_weight!r}) distils from a copy of "
                             f"the starting model, but without model.init_from that is a fresh initialisation, which "
                             f"teaches nothing; give model.init_from=<trained run> or distill.teacher=<trained run>.")
        if d.teacher and not (d.enabled or d.sequence_level):
            raise ValueError(f"distill.teacher: {d.teacher!r} is given but distill.alpha and distill.hidden_weight "
                             f"are 0 and distill.targets is 'references', so nothing is distilled; set distill.alpha "
                             f"(e.g. 0.5) or distill.targets=teacher, or leave the teacher out.")

    def _check_kept_per_kind(self) -> None:
        """kept_per_kind splits the schedule's final amount between the kinds: every kind named, the counts within
        [min_heads_per_layer × layers, heads × layers], summing to what the schedule's last fraction keeps."""
        p, m = self.pruning, self.model
        if not p.kept_per_kind:
            return
        schedule = p.schedule_steps or p.schedule
        if not schedule or p.method != "importance":
            raise ValueError("pruning.kept_per_kind: needs a pruning schedule (pruning.schedule_steps or "
                             "pruning.schedule) with pruning.method=importance.")
        if p.scope != "kind":
            raise ValueError(f"pruning.kept_per_kind: ranks each kind within itself, so it needs pruning.scope=kind "
                             f"(not {p.scope!r}).")
        missing = [k for k in KINDS if k not in p.kept_per_kind]
        if missing:
            raise ValueError(f"pruning.kept_per_kind: {p.kept_per_kind!r} does not name {', '.join(missing)}; give "
                             f"the heads every kind keeps.")
        low, high = p.min_heads_per_layer * m.layers, m.heads * m.layers
        for kind, kept in p.kept_per_kind.items():
            if not low <= kept <= high:
                raise ValueError(f"pruning.kept_per_kind[{kind}]: {kept} is not allowed; a kind of {m.layers} sites "
                                 f"keeps between {low} and {high} heads.")
        total = original_heads_of(m)
        final = schedule[max(schedule)]
        kept_total = total - _pruned_heads(final, total)
        if sum(p.kept_per_kind.values()) != kept_total:
            raise ValueError(f"pruning.kept_per_kind: {p.kept_per_kind!r} keeps {sum(p.kept_per_kind.values())} "
                             f"heads, but the schedule's last fraction {final:g} keeps {kept_total} of {total}.")

    def kind_amounts(self, fraction: float) -> dict[str, int]:
        """The per-kind counts pruned once the schedule has reached `fraction` of all heads: each kind's final
        amount (heads × layers − kept) times the share of the final fraction reached, rounded half up."""
        p, m = self.pruning, self.model
        schedule = p.schedule_steps or p.schedule
        progress = fraction / schedule[max(schedule)] if schedule[max(schedule)] else 0.0
        return {kind: _pruned_heads(progress, m.heads * m.layers - kept) for kind, kept in p.kept_per_kind.items()}

    def _check_reachable(self, key: str, fractions) -> None:
        """Every site keeps `min_heads_per_layer` heads, so a fraction of a group of sites (all sites for scope
        global, one kind's for kind, one site for layer) can prune at most (heads − min) per site."""
        p, m = self.pruning, self.model
        sites = {"global": 3 * m.layers, "kind": m.layers, "layer": 1}[p.scope]  # Marian: 3 attention kinds
        total, prunable = sites * m.heads, sites * (m.heads - p.min_heads_per_layer)
        for fraction in fractions:
            if _pruned_heads(fraction, total) > prunable:
                reachable = prunable / total
                raise ValueError(f"{key}: {fraction!r} is out of reach: with pruning.min_heads_per_layer="
                                 f"{p.min_heads_per_layer} and model.heads={m.heads} at most {reachable:.4g} of the "
                                 f"heads (scope {p.scope}) can be pruned.")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def original_heads_of(model: ModelConfig) -> int:
    """Heads of a recipe's model before any pruning (Marian: 3 attention kinds × layers × heads)."""
    return len(KINDS) * model.layers * model.heads


def recipe_from_dict(data: dict):
    """Validate a raw recipe mapping into its dataclass (`Recipe`, or another kind named by `kind:`).

    Args:
        data: the mapping as read from YAML (sections of keys).
    """
    return build_dataclass(recipe_class(data), data, "")


def available_recipes(directory: Path = RECIPES_DIR) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.yaml"))


def recipe_path(name_or_path: str, directory: Path = RECIPES_DIR) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    candidate = directory / f"{name_or_path}.yaml"
    if candidate.is_file():
        return candidate
    raise ValueError(f"recipe: {name_or_path!r} is not a recipe; available: {', '.join(available_recipes(directory))} "
                     f"(or a path to a .yaml file).")


def load_recipe(name_or_path: str, overrides: list[str] | None = None, directory: Path = RECIPES_DIR) -> Recipe:
    """Load a recipe by name (`recipes/<name>.yaml`) or path, apply `section.key=value` overrides and validate it
    (types, ranges, cross-field rules): any mistake is a `ValueError` naming the recipe key.

    Args:
        name_or_path: a recipe name (see `available_recipes`) or a path to a `.yaml` file.
        overrides: `section.key=value` strings, applied in order (the CLI's `--set`).
        directory: where recipe names are looked up (the package's recipes by default).
    """
    path = recipe_path(name_or_path, directory)
    data = load_recipe_mapping(path.read_bytes(), f"recipe: {str(path)!r}")  # strict YAML (prunetrain.mt.config.recipe_yaml)
    for override in overrides or []:
        apply_override(data, override)
    return recipe_from_dict(data)


def settings_changed(recipe: dict, directory: Path = RECIPES_DIR) -> list[str] | None:
    """The `section.key` names whose values in a run's recipe (`Recipe.to_dict()`) differ from the packaged recipe of
    the same name as written (a `--smoke` preset, `--set`, `--data-dir`), in section order; the description is not
    compared. None when no packaged recipe has that name or it no longer validates (a run from a recipe file)."""
    try:
        written = load_recipe(recipe["name"], directory=directory).to_dict()
    except (ValueError, KeyError, OSError):
        return None
    changed = []
    for section, values in recipe.items():
        if isinstance(values, dict) and isinstance(written.get(section), dict):
            changed += [f"{section}.{key}" for key, value in values.items() if written[section].get(key) != value]
        elif section != "description" and written.get(section) != values:
            changed.append(section)
    return changed


def recipe_class(data: dict):
    """The dataclass a raw recipe mapping validates into, chosen by its `kind` key (default "translation")."""
    kind = data.get("kind", "translation") if isinstance(data, dict) else "translation"
    if kind not in RECIPE_KINDS:
        raise ValueError(f"kind: {kind!r} is not a recipe kind; allowed: {', '.join(RECIPE_KINDS)}.")
    return RECIPE_KINDS[kind]


def apply_override(data: dict, override: str) -> None:
    """`section.key=value` (value parsed as YAML: 3, 0.5, true, [1, 2], {5: 0.2}) into the raw recipe mapping.

    Args:
        data: the raw recipe mapping, changed in place.
        override: one `section.key=value` string.
    """
    if "=" not in override:
        raise ValueError(f"--set: {override!r} is not of the form section.key=value (e.g. train.epochs=3).")
    key, raw = override.split("=", 1)
    parts = key.strip().split(".")
    value = load_override_value(raw, f"--set {key.strip()}")
    if value is None:
        value = ""
    target = data
    cls = recipe_class(data)
    for i, part in enumerate(parts):
        names = [f.name for f in dataclasses.fields(cls)]
        if part not in names:
            where = ".".join(parts[:i]) or "recipe"
            raise ValueError(f"--set {key}: unknown key {part!r}; valid keys in {where} are {', '.join(names)}.")
        tp = typing.get_type_hints(cls)[part]
        if i == len(parts) - 1:
            if dataclasses.is_dataclass(tp):
                raise ValueError(f"--set {key}: {key!r} is a section; set one of its keys, e.g. {key}."
                                 f"{dataclasses.fields(tp)[0].name}=...")
            if tp is str and not (raw.strip()[:1] in ("'", '"') and isinstance(value, str)):
                value = raw.strip()  # a string is what was typed (a path may hold '#' or ': '), unless quoted
            target[part] = value
        else:
            if not dataclasses.is_dataclass(tp):
                raise ValueError(f"--set {key}: {part!r} is not a section.")
            target = target.setdefault(part, {})
            cls = tp


def recipe_to_yaml(recipe) -> str:
    return yaml.safe_dump(recipe.to_dict(), sort_keys=False, allow_unicode=True, width=2**31 - 1)  # no folded paths


RECIPE_KINDS = {"translation": Recipe, "l0-sweep": GateSweepRecipe}
__all__ = ["DataConfig", "DistillConfig", "EvalConfig", "GateEvalConfig", "GateSweepRecipe", "GateTrainConfig",
           "ModelConfig", "PruningConfig", "Recipe", "RECIPE_KINDS", "SweepConfig", "TrainConfig", "apply_override",
           "available_recipes", "load_recipe", "original_heads_of", "recipe_class", "recipe_from_dict", "recipe_path",
           "recipe_to_yaml"]

