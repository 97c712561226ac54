"""Recipes: YAML files in `recipes/`, validated into dataclasses (unknown keys and wrong types are errors that list
what is valid). `--set section.key=value` overrides any field.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"  # shipped as package data


@dataclass
class DataConfig:
    dir: str = ""  # parallel-text directory (train|valid|test.{src,tgt}); "" = <shared data>/multi30k
    hf_dataset: str = ""  # a Hugging Face dataset name instead of `dir` (needs network)
    src: str = "de"
    tgt: str = "en"
    train_limit: int = 0  # use only the first N training pairs (0: all)
    test_split: str = "test"
    vocab_size: int = 8000  # joint subword vocabulary (byte-level BPE) trained on the training split
    max_length: int = 128  # tokens per sentence (longer ones are truncated)


@dataclass
class ModelConfig:
    layers: int = 6  # encoder layers = decoder layers (Michel et al. §6: 6 + 6)
    heads: int = 8  # heads per attention layer (Michel et al. §6: 8)
    d_model: int = 256  # sized for CPU; the paper-sized GPU setting is 512 / ffn 2048
    ffn_dim: int = 1024
    dropout: float = 0.1
    attn_implementation: str = "eager"  # eager + bf16 autocast trains fastest on CPU (FACTS)


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
    precision: str = "auto"  # auto | bf16 | fp32; auto = bf16 autocast only where it is fast (prunetrain.utils.device)
    seed: int = 0
    max_minutes: float = 0.0  # stop training gracefully after this long (0: no limit)
    logging_steps: int = 50
    save_total_limit: int = 2


@dataclass
class PruningConfig:
    importance_epochs: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 12])  # record importance
    curve_epochs: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 12])  # pruned-BLEU curves (Michel §6)
    curve_fractions: list[float] = field(default_factory=lambda: [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8])
    curve_sentences: int = 500  # first N validation sentences for the curves
    curve_random_baseline: bool = False  # also curves in random order
    importance_batches: int = 8  # fixed training batches for importance
    importance_batch_size: int = 64
    schedule: dict[int, float] = field(default_factory=dict)  # prune during training: {epoch: cumulative fraction}
    mode: str = "mask"  # during-training pruning: mask | shrink
    final_fraction: float = 0.5  # pruned by importance after training, then shrunk
    scope: str = "global"  # global | layer | kind
    min_heads_per_layer: int = 1


@dataclass
class EvalConfig:
    num_beams: int = 4  # final BLEU (curves use greedy decoding)
    test_limit: int = 0  # score only the first N test sentences (0: all)
    batch_size: int = 50
    curve_batch_size: int = 100
    bench: bool = True  # benchmark original vs shrunk generation at the end
    bench_repeats: int = 3


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

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _coerce(value, tp, where: str):
    """Check `value` against the annotation `tp` (int, float, bool, str, list[...], dict[...]); ints pass as floats."""
    origin = typing.get_origin(tp)
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ValueError(f"{where}: {value!r} is not a list of {_type_name(item)}.")
        return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_tp, value_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ValueError(f"{where}: {value!r} is not a mapping of {_type_name(key_tp)} to {_type_name(value_tp)}.")
        return {_coerce(k, key_tp, f"{where} key"): _coerce(v, value_tp, f"{where}[{k}]") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: {value!r} is not a boolean (true/false).")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: {value!r} is not an integer.")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: {value!r} is not a number.")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{where}: {value!r} is not a string.")
        return value
    raise TypeError(f"{where}: unsupported annotation {tp!r}")  # pragma: no cover


def _build(cls, data: Any, where: str):
    if not isinstance(data, dict):
        raise ValueError(f"{where or 'recipe'}: expected a mapping of keys, got {data!r}.")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in names:
            raise ValueError(f"{path}: unknown key; valid keys{' in ' + where if where else ''} are "
                             f"{', '.join(names)}.")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, path)
        else:
            kwargs[key] = _coerce(value, tp, path)
    return cls(**kwargs)


def recipe_from_dict(data: dict):
    """Validate a raw recipe mapping into its dataclass (`Recipe`, or another kind named by `kind:`)."""
    return _build(recipe_class(data), data, "")


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
    """Load a recipe by name (`recipes/<name>.yaml`) or path, then apply `section.key=value` overrides."""
    path = recipe_path(name_or_path, directory)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"recipe: {str(path)!r} is not valid YAML ({err.__class__.__name__}).") from None
    for override in overrides or []:
        apply_override(data, override)
    return recipe_from_dict(data)


def recipe_class(data: dict):
    """The dataclass a raw recipe mapping validates into, chosen by its `kind` key (default "translation")."""
    kind = data.get("kind", "translation") if isinstance(data, dict) else "translation"
    if kind not in RECIPE_KINDS:
        raise ValueError(f"kind: {kind!r} is not a recipe kind; allowed: {', '.join(RECIPE_KINDS)}.")
    return RECIPE_KINDS[kind]


def apply_override(data: dict, override: str) -> None:
    """`section.key=value` (value parsed as YAML: 3, 0.5, true, [1, 2], {5: 0.2}) into the raw recipe mapping."""
    if "=" not in override:
        raise ValueError(f"--set: {override!r} is not of the form section.key=value (e.g. train.epochs=3).")
    key, raw = override.split("=", 1)
    parts = key.strip().split(".")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
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
            if tp is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if tp is str and not isinstance(value, str):
                value = raw
            target[part] = value
        else:
            if not dataclasses.is_dataclass(tp):
                raise ValueError(f"--set {key}: {part!r} is not a section.")
            target = target.setdefault(part, {})
            cls = tp


def recipe_to_yaml(recipe) -> str:
    return yaml.safe_dump(recipe.to_dict(), sort_keys=False, allow_unicode=True)


# ---------------------------------------------------------------------------------------------------------------------
# kind "l0-sweep": Hard-Concrete gate sweeps from a converged model (Voita et al. 2019 §6)
# ---------------------------------------------------------------------------------------------------------------------
@dataclass
class GateTrainConfig:
    steps: int = 150  # fine-tuning steps per gate run (from the converged model)
    batch_size: int = 64
    learning_rate: float = 1e-4  # model weights (constant); the gates have their own Adam
    gate_lr: float = 0.1
    lagrangian_lr: float = 0.05
    init_log_alpha: float = 3.0
    label_smoothing: float = 0.1
    precision: str = "auto"
    seed: int = 0
    logging_steps: int = 10  # heads alive per kind are traced (JSON, TensorBoard) at this interval


@dataclass
class SweepConfig:
    encoder_lambdas: list[float] = field(default_factory=lambda: [0.0, 0.003, 0.01, 0.03, 0.1])
    all_lambdas: list[float] = field(default_factory=lambda: [0.003, 0.01, 0.03])  # gates on every kind
    budgets: list[float] = field(default_factory=lambda: [0.25])  # Lagrangian head budgets (share of all heads)
    importance_baseline: bool = True  # encoder heads pruned by Michel importance at the same counts (no training)
    scratch: bool = True  # train the pruned head configuration from scratch (Voita Table 2)
    scratch_run: str = "budget"  # which configuration: "budget" (first budget run) or "lambda:<value>"
    scratch_steps: int = 0  # 0: as many steps as the source model was trained for
    scratch_minutes: float = 0.0  # stop the from-scratch training after this long (0: no limit)


@dataclass
class GateEvalConfig:
    sentences: int = 500  # validation sentences scored after every run
    batch_size: int = 100
    num_beams: int = 1


@dataclass
class GateSweepRecipe:
    """Hard-Concrete gate sweeps (kind "l0-sweep") on a converged translation model (Voita et al. 2019 §6)."""

    kind: str = "l0-sweep"
    name: str = "custom-l0"
    description: str = ""
    source: str = "checkpoints/wmt-small-deen"  # a finished translation recipe run (its full/ model and recipe.yaml)
    data: DataConfig = field(default_factory=DataConfig)
    train: GateTrainConfig = field(default_factory=GateTrainConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    eval: GateEvalConfig = field(default_factory=GateEvalConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


RECIPE_KINDS = {"translation": Recipe, "l0-sweep": GateSweepRecipe}
