"""Masks attached while the Trainer saves (issue 24, follow-up), with real `Trainer` runs on Multi30k sentences.

- `HeadPruningCallback` masks first and shrinks later (the main recipe's pattern, scaled down): a Marian translation
  model under `Seq2SeqTrainer` masks a quarter of its heads at step 2, prunes to half and shrinks at step 5 and masks
  more at step 7. The checkpoint of step 3 is masked with whole weights, that of step 6 shrunk, that of step 8 and
  the final `save_model` shrunk *and* masked.
- `HardConcreteCallback(finalize="mask")` on a Qwen2-style GQA model: checkpoints taken while the gates train hold
  them as the model evaluates (deterministic gates); the final `save_model` holds the budgeted final mask.

Every directory loads as the model that wrote it: `prunetrain.load_pruned` (bit-identical logits, the masks
attached again), `from_pretrained(dir, trust_remote_code=True)` in a process that cannot import prunetrain
(bit-identical logits and beam search), `prunetrain export` (the model shrunk with its masks, within rounding); plain
transformers refuses it. Resuming: kill -9 after a masked checkpoint, resume from it loaded by plain transformers or
rebuilt with `restore_layout`, end where the uninterrupted run ends; a shrunk checkpoint resumed into a freshly built
full-size model and `load_best_model_at_end` across a shrink fail with prunetrain's one-line message."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from transformers import TrainerCallback

import prunetrain as pt
from prunetrain.engine.mask import owner_label
from prunetrain.engine.remote_code import GUARD_MESSAGE_MASKED
from prunetrain.export.formats import export
from prunetrain.mt.text.data import build_dataset, make_collator, marian_config, read_parallel, train_tokenizer
from tests.conftest import run_cli
from tests.test_seams_trainer import _load_without_prunetrain

BATCH = 16
STEPS = 8


@pytest.fixture(scope="module")
def sentences(multi30k_dir):
    pairs = read_parallel(multi30k_dir, "train", limit=64)
    return pairs, train_tokenizer(pairs, vocab_size=300)


class _Snapshots(TrainerCallback):
    """At every checkpoint: the weights, the head layout, the attached masks and the logits (and beam search) of
    the model as it evaluates, on one fixed batch (registered after the pruning callback)."""

    def __init__(self, inputs: dict, generate: dict | None = None):
        self.inputs, self.generate, self.at = inputs, generate, {}

    def take(self, model) -> dict:
        training = model.training
        model.eval()
        with torch.no_grad():
            snap = {"weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
                    "layout": pt.find_heads(model), "logits": model(**self.inputs).logits,
                    "masks": [owner_label(m._owner) for m in pt.attached_masks(model)]}
            if self.generate is not None:
                snap["generated"] = model.generate(**self.generate)
        model.train(training)
        return snap

    def on_save(self, args, state, control, model=None, **kwargs):
        self.at[state.global_step] = self.take(model)


class _CloseOneGroup(TrainerCallback):
    """Shut the first key/value group's gate before the first step, so the gates' test-time mask is not all ones
    from the first checkpoint on (the callback's defaults need many steps to close a gate)."""

    def __init__(self, gates_callback):
        self.gates_callback = gates_callback

    def on_train_begin(self, args, state, control, **kwargs):
        gates = self.gates_callback.gates
        with torch.no_grad():
            gates.site_log_alpha(gates.site_names[0])[0] = -5.0


def _marian(tokenizer, pairs):
    model = transformers.MarianMTModel(marian_config(tokenizer, d_model=32, ffn_dim=64, layers=2, heads=4,
                                                     dropout=0.0, attn_implementation="eager"))
    return model, build_dataset(pairs, tokenizer, max_length=24), make_collator(tokenizer, model)


def _qwen2(tokenizer, pairs):
    config = transformers.Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                                      max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
                                      tie_word_embeddings=False, attn_implementation="eager")
    enc = tokenizer([t for _, t in pairs], truncation=True, max_length=24)
    return (transformers.Qwen2ForCausalLM(config), [{"input_ids": ids} for ids in enc["input_ids"]],
            transformers.DataCollatorForLanguageModeling(tokenizer, mlm=False))


def _run(trainer_class, model, dataset, collate, tokenizer, out, callbacks, **extra):
    args_class = (transformers.Seq2SeqTrainingArguments if trainer_class is transformers.Seq2SeqTrainer
                  else transformers.TrainingArguments)
    args = args_class(output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=BATCH, learning_rate=2e-3,
                      save_strategy="steps", save_steps=3, report_to=[], use_cpu=True, logging_steps=2, seed=0,
                      disable_tqdm=True, **extra)
    trainer = trainer_class(model=model, args=args, train_dataset=dataset, data_collator=collate,
                            processing_class=tokenizer, callbacks=callbacks)
    trainer.train()
    trainer.save_model(str(out / "final"))
    return trainer


def _check_loads_as_saved(path: Path, snap: dict, inputs: dict, shrunk: bool, owners: list):
    """`path` is a pruned directory (guarded; a masked-only model's guard says so) that `load_pruned` rebuilds with
    the snapshot's weights and layout, the recorded masks attached (their owners), and bit-identical logits."""
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"].endswith("-pruned-by-prunetrain") and (path / "modeling_prunetrain.py").is_file()
    assert [e["owner"] for e in config["prunetrain_export"].get("masks", [])] == owners, path
    message = config.get("d_model", config.get("hidden_size"))
    assert (message == GUARD_MESSAGE_MASKED) is (bool(owners) and not shrunk), (path, message)
    loaded = pt.load_pruned(path)
    assert pt.find_heads(loaded) == snap["layout"]
    state = loaded.state_dict()
    assert state.keys() == snap["weights"].keys() and all(torch.equal(state[k], v) for k, v in snap["weights"].items())
    assert [m._owner.name for m in pt.attached_masks(loaded)] == owners
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, snap["logits"]), path


def _case(path: Path, auto: str, cls: str, inputs: dict, snap: dict, generate: dict | None) -> dict:
    case = {"path": str(path), "auto": auto, "class": cls, "inputs": inputs, "logits": snap["logits"],
            "text": "Zwei junge Männer spielen."}
    if generate is not None:
        case.update(generate=generate, generated=snap["generated"])
    return case


def _check_without_prunetrain(cases: dict, tmp_path: Path, tokenizer):
    results = _load_without_prunetrain(cases, tmp_path)
    for key, res in results.items():
        assert res["logits_equal"] is True and res.get("generate_equal", True) is True, key
        assert res["tokenizer"] == tokenizer("Zwei junge Männer spielen.")["input_ids"], key
        assert "trust_remote_code=True" in res["plain_auto"], (key, res["plain_auto"])
        assert "prunetrain" in res["plain_class_ignore_sizes"] \
            and "load_pruned" in res["plain_class_ignore_sizes"], (key, res["plain_class_ignore_sizes"])


def test_mask_mode_checkpoints_load_as_the_masked_model(sentences, tmp_path):
    pairs, tokenizer = sentences
    torch.manual_seed(0)
    model, dataset, collate = _marian(tokenizer, pairs)
    batches = [collate([dataset[i] for i in range(j, j + BATCH)]) for j in (0, BATCH)]
    inputs = {k: v for k, v in batches[0].items() if k != "labels"}
    generate = {"input_ids": inputs["input_ids"][:2], "attention_mask": inputs["attention_mask"][:2],
                "max_new_tokens": 5, "do_sample": False, "num_beams": 2}
    pruning = pt.HeadPruningCallback(at_epochs=[], prune_steps={2: 0.25, 5: 0.5, 7: 0.625}, shrink_steps=[5],
                                     batches=batches)
    snapshots = _Snapshots(inputs, generate)
    out = tmp_path / "run"
    _run(transformers.Seq2SeqTrainer, model, dataset, collate, tokenizer, out, [pruning, snapshots])
    assert [(e["step"], e["mode"], e["heads_after"]) for e in pruning.events] == [
        (2, "mask", 18), (5, "mask", 12), (5, "shrink", 12), (7, "mask", 9)]
    final = snapshots.take(model)
    for path, snap, shrunk, owners in ((out / "checkpoint-3", snapshots.at[3], False, ["head-pruning"]),
                                       (out / "checkpoint-6", snapshots.at[6], True, []),
                                       (out / "checkpoint-8", snapshots.at[8], True, ["head-pruning"]),
                                       (out / "final", final, True, ["head-pruning"])):
        assert snap["masks"] == (["head-pruning"] if owners else [])
        _check_loads_as_saved(path, snap, inputs, shrunk, owners)

    shrunk = pt.load_pruned(out / "checkpoint-3", masks="shrink")  # the masked heads removed
    assert pt.find_heads(shrunk).total_heads == 18 and not pt.attached_masks(shrunk)
    with torch.no_grad():
        assert (shrunk(**inputs).logits - snapshots.at[3]["logits"]).abs().max() <= 1e-5
    exported = export(out / "final", tmp_path / "exported", "remote-code")  # the model shrunk with its mask
    assert exported["heads"].startswith("9 heads")
    with torch.no_grad():
        assert (pt.load_pruned(tmp_path / "exported")(**inputs).logits - final["logits"]).abs().max() <= 1e-5
    check = run_cli("export", "--check", out / "final")
    assert check.returncode == 0, check.stderr

    cases = {name: _case(out / name, "AutoModelForSeq2SeqLM", "MarianMTModel", inputs, snap, generate)
             for name, snap in (("checkpoint-3", snapshots.at[3]), ("final", final))}
    _check_without_prunetrain(cases, tmp_path, tokenizer)


def test_gates_checkpoints_and_the_final_mask_load_as_the_model_evaluates(sentences, tmp_path):
    pairs, tokenizer = sentences
    torch.manual_seed(0)
    model, dataset, collate = _qwen2(tokenizer, pairs)
    batch = collate(dataset[:BATCH])
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    generate = {"input_ids": inputs["input_ids"][:2], "attention_mask": inputs["attention_mask"][:2],
                "max_new_tokens": 4, "do_sample": False, "num_beams": 2}
    gates = pt.HardConcreteCallback(target_heads=8, finalize="mask")
    snapshots = _Snapshots(inputs, generate)
    out = tmp_path / "run"
    _run(transformers.Trainer, model, dataset, collate, tokenizer, out, [gates, _CloseOneGroup(gates), snapshots])
    assert gates.final_mask.num_kept == 8 and pt.attached_masks(model) == [gates.final_mask]
    final = snapshots.take(model)
    for step in (3, 6):
        assert snapshots.at[step]["masks"] == []  # gates are not a HeadMask; the save records them all the same
        _check_loads_as_saved(out / f"checkpoint-{step}", snapshots.at[step], inputs, False, ["hard-concrete"])
        [record] = json.loads((out / f"checkpoint-{step}" / "config.json").read_text())["prunetrain_export"]["masks"]
        assert record["sites"]["model.layers.0.self_attn"]["keep"][:4] == [0.0] * 4  # the shut group
    # the final mask belongs to the model, not to a callback that would take it back on resume
    _check_loads_as_saved(out / "final", final, inputs, False, [None])
    cases = {name: _case(out / name, "AutoModelForCausalLM", "Qwen2ForCausalLM", inputs, snap, generate)
             for name, snap in (("checkpoint-6", snapshots.at[6]), ("final", final))}
    _check_without_prunetrain(cases, tmp_path, tokenizer)


# ---------------------------------------------------------------------------------------------------------------------
# resuming
# ---------------------------------------------------------------------------------------------------------------------
SCRIPT = Path(__file__).with_name("dist") / "resume_masked_checkpoint.py"


@pytest.mark.slow
@pytest.mark.parametrize("method", ["mask", "gates"])
def test_a_run_killed_after_a_masked_checkpoint_resumes_to_the_same_end(method, tmp_path, multi30k_dir):
    """kill -9 at step 8, after checkpoint-6 was saved with the mask (or the gates) attached. Resumed twice from it:
    loaded by plain transformers (`AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True)`) and rebuilt
    with `restore_layout` into a freshly built model. The loaded model is the masked model of step 6; the callback
    takes its mask back and restores its own state, and the run ends exactly where the uninterrupted run ends (with
    "mask": the shrink at step 10 finds no other mask attached)."""
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", HF_MODULES_CACHE=str(tmp_path / "modules"))

    def run(out, *extra):
        return subprocess.run([sys.executable, str(SCRIPT), "--method", method, "--data", str(multi30k_dir),
                               "--out", str(out), *extra], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600, stdin=subprocess.DEVNULL)

    full, killed = tmp_path / "full", tmp_path / "killed"
    done = run(full)
    assert done.returncode == 0, done.stderr[-3000:]
    crashed = run(killed, "--kill-at-step", "8")
    assert crashed.returncode == -9 and not (killed / "result.json").exists()
    config = json.loads((killed / "checkpoint-6" / "config.json").read_text())
    assert config["model_type"].endswith("-by-prunetrain") and config["prunetrain_export"]["masks"]
    shutil.copytree(killed, tmp_path / "killed-layout")
    a = json.loads((full / "result.json").read_text())
    for out, load in ((killed, "remote"), (tmp_path / "killed-layout", "layout")):
        resumed = run(out, "--resume", load)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        b = json.loads((out / "result.json").read_text())
        assert b["resumed_from"].endswith("checkpoint-6")
        if load == "remote":  # the loaded model is the masked model of step 6, in the checkpoint's own code
            assert b["loaded_logits"] == a["logits_at"]["6"]
            assert b["model_class"].endswith("modeling_prunetrain.Qwen2ForCausalLM")
        assert b["logits_at_start"] == a["logits_at"]["6"], load  # resumed: the model of step 6, as it evaluates
        assert b["events"] == a["events"] and b["layout"] == a["layout"] and b["masks"] == a["masks"]
        assert b["weights"].keys() == a["weights"].keys()
        assert all(b["weights"][k] == a["weights"][k] for k in a["weights"]), load
        assert b["gates"] == a["gates"]
    if method == "mask":
        assert [e[:2] for e in a["events"]] == [[4, "mask"], [10, "mask"], [10, "shrink"]]
    else:
        assert len(a["masks"]) == 1 and a["masks"][0][0] is None  # the final mask alone


def _shrinking_run(sentences, out: Path, **extra):
    pairs, tokenizer = sentences
    torch.manual_seed(0)
    model, dataset, collate = _qwen2(tokenizer, pairs)
    batches = [collate(dataset[j:j + BATCH]) for j in (0, BATCH)]
    pruning = pt.HeadPruningCallback(at_epochs=[], prune_steps={3: 0.5}, shrink_steps=[3], batches=batches)
    args = transformers.TrainingArguments(output_dir=str(out), max_steps=6, per_device_train_batch_size=BATCH,
                                          learning_rate=2e-3, save_strategy="steps", save_steps=2, report_to=[],
                                          use_cpu=True, seed=0, disable_tqdm=True, **extra)
    return transformers.Trainer(model=model, args=args, train_dataset=dataset, data_collator=collate,
                                processing_class=tokenizer, callbacks=[pruning], **(
                                    {"eval_dataset": dataset[:BATCH]} if "eval_strategy" in extra else {}))


def test_resuming_a_shrunk_checkpoint_into_a_full_size_model_says_what_to_do(sentences, tmp_path):
    _shrinking_run(sentences, tmp_path / "run").train()
    fresh = _shrinking_run(sentences, tmp_path / "run")  # a freshly built full-size model, no restore_layout
    with pytest.raises(ValueError, match=r"model: the weights being loaded have fewer attention heads than the model "
                                         r"\(tensor 'model\.layers\.0\.self_attn\.q_proj\.weight' of site "
                                         r"'model\.layers\.0\.self_attn' is \(16, 32\) in them, \(32, 32\) in the "
                                         r"model\): they are a checkpoint of a run that shrank its heads; give the "
                                         r"model their layout first with prunetrain\.restore_layout\(model, "
                                         r"checkpoint\)"):
        fresh.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-4"))


def test_load_best_model_at_end_across_a_shrink_says_what_to_do(sentences, tmp_path):
    calls = []

    def first_is_best(prediction):  # the evaluation at step 2 (before the shrink at step 3) is the best
        calls.append(1)
        return {"order": -len(calls)}

    trainer = _shrinking_run(sentences, tmp_path / "run", eval_strategy="steps", eval_steps=2,
                             load_best_model_at_end=True, metric_for_best_model="order", greater_is_better=True)
    trainer.compute_metrics = first_is_best
    with pytest.raises(ValueError, match=r"model: the weights being loaded have more attention heads than the model "
                                         r"\(.*\): they were saved before the model was shrunk, and a shrunk model "
                                         r"cannot take heads back \(load_best_model_at_end does this when the best "
                                         r"checkpoint is from before a shrink\); set load_best_model_at_end=False"):
        trainer.train()
    assert trainer.state.best_model_checkpoint.endswith("checkpoint-2")
