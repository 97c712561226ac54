"""Every directory the HF stack writes after a mid-training shrink is a proper pruned directory (issue 24, seams 1 and
4): `trainer.save_model()`, every Trainer checkpoint after the shrink and `model.save_pretrained` by the user.

Three real `Trainer` runs on Multi30k sentences (a BERT/MiniLM-shaped sentence classifier with 12 heads per layer,
a Qwen2-style causal LM with 8 query heads on 2 key/value heads, a Marian translation model under
`Seq2SeqTrainer`) mask half of the heads at step 4 and shrink them away at once (`shrink_steps`). Checked on what
they wrote: a checkpoint from before the shrink is a plain directory; every one after it holds the guarded config,
`modeling_prunetrain.py` and `prunetrain_layout.json`, and `prunetrain.load_pruned` rebuilds exactly the weights
the model had when it was written. In a process that cannot import prunetrain: `from_pretrained(dir,
trust_remote_code=True)` gives bit-identical logits (and generation), a plain `AutoModel*.from_pretrained` and the
model class with `ignore_mismatched_sizes=True` refuse, and a plain `AutoTokenizer.from_pretrained(dir)` loads the
tokenizer the Trainer saved beside the model. `prunetrain export --check` accepts the final directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from transformers import TrainerCallback

import prunetrain as pt
from prunetrain.mt.text.data import read_parallel, train_tokenizer
from tests.conftest import run_cli

BATCH = 16
STEPS = 8  # shrink at step 4; checkpoints at steps 3 (before it), 6 and 8


@pytest.fixture(scope="module")
def sentences(multi30k_dir):
    pairs = read_parallel(multi30k_dir, "train", limit=64)
    return pairs, train_tokenizer(pairs, vocab_size=300)


def _classifier(tokenizer, pairs):
    config = transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=48, num_hidden_layers=2,
                                     num_attention_heads=12, intermediate_size=96, max_position_embeddings=64,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=2,
                                     pad_token_id=tokenizer.pad_token_id)
    texts = [s for pair in pairs for s in pair]
    enc = tokenizer(texts, truncation=True, max_length=24)
    dataset = [{"input_ids": ids, "labels": i % 2} for i, ids in enumerate(enc["input_ids"])]
    return (transformers.BertForSequenceClassification(config), dataset,
            transformers.DataCollatorWithPadding(tokenizer), transformers.Trainer, "AutoModelForSequenceClassification")


def _gqa_lm(tokenizer, pairs):
    config = transformers.Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                                      max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
                                      tie_word_embeddings=False)
    enc = tokenizer([t for _, t in pairs], truncation=True, max_length=24)
    dataset = [{"input_ids": ids} for ids in enc["input_ids"]]
    return (transformers.Qwen2ForCausalLM(config), dataset,
            transformers.DataCollatorForLanguageModeling(tokenizer, mlm=False), transformers.Trainer,
            "AutoModelForCausalLM")


def _translator(tokenizer, pairs):
    from prunetrain.mt.text.data import build_dataset, make_collator, marian_config

    model = transformers.MarianMTModel(marian_config(tokenizer, d_model=32, ffn_dim=64, layers=2, heads=4,
                                                     dropout=0.0, attn_implementation="eager"))
    return (model, build_dataset(pairs, tokenizer, max_length=24), make_collator(tokenizer, model),
            transformers.Seq2SeqTrainer, "AutoModelForSeq2SeqLM")


TASKS = {"classification": _classifier, "causal-lm-gqa": _gqa_lm, "seq2seq": _translator}


class _Snapshots(TrainerCallback):
    """The weights and head layout the model had at every checkpoint (registered after the pruning callback)."""

    def __init__(self):
        self.at: dict[int, tuple[dict, dict]] = {}

    def on_save(self, args, state, control, model=None, **kwargs):
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.at[state.global_step] = (weights, pt.find_heads(model).to_dict())


def _train(task, sentences, out: Path):
    pairs, tokenizer = sentences
    torch.manual_seed(0)
    model, dataset, collate, trainer_class, auto = TASKS[task](tokenizer, pairs)
    batches = [collate([dataset[i] for i in range(j, j + BATCH)]) for j in (0, BATCH)]
    pruning = pt.HeadPruningCallback(at_epochs=[], prune_steps={4: 0.5}, shrink_steps=[4], batches=batches,
                                     tensorboard=False)
    snapshots = _Snapshots()
    args_class = (transformers.Seq2SeqTrainingArguments if trainer_class is transformers.Seq2SeqTrainer
                  else transformers.TrainingArguments)
    args = args_class(output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=BATCH, learning_rate=2e-3,
                      save_strategy="steps", save_steps=3, report_to=[], use_cpu=True, logging_steps=2, seed=0,
                      disable_tqdm=True)
    trainer = trainer_class(model=model, args=args, train_dataset=dataset, data_collator=collate,
                            processing_class=tokenizer, callbacks=[pruning, snapshots])
    heads = pt.find_heads(model).total_heads
    trainer.train()
    assert [(e["step"], e["mode"], e["heads_after"]) for e in pruning.events] == [(4, "mask", heads // 2),
                                                                                   (4, "shrink", heads // 2)]
    trainer.save_model(str(out / "final"))
    model.save_pretrained(out / "user")
    return model.eval(), tokenizer, auto, snapshots.at, batches[0]


def _check_pruned_directory(path: Path, weights: dict, layout: dict):
    files = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "modeling_prunetrain.py", "prunetrain_layout.json"} <= files, files
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"].endswith("-pruned-by-prunetrain") and "auto_map" in config
    loaded = pt.load_pruned(path)
    assert pt.find_heads(loaded).to_dict() == layout
    state = loaded.state_dict()
    assert state.keys() == weights.keys() and all(torch.equal(state[k], weights[k]) for k in weights), path


_CHILD = r"""
import json, sys
sys.path.append(sys.argv.pop(1))  # site-packages without its .pth files: torch and transformers, not prunetrain
import torch, transformers as tf
cases = torch.load(sys.argv[1], weights_only=True)
out = {}
try:
    import prunetrain  # noqa: F401
    out["prunetrain_importable"] = True
except ImportError:
    out["prunetrain_importable"] = False
for key, case in cases.items():
    path, auto = case["path"], getattr(tf, case["auto"])
    res = {}
    model = auto.from_pretrained(path, trust_remote_code=True).eval()
    with torch.no_grad():
        res["logits_equal"] = torch.equal(model(**case["inputs"]).logits, case["logits"])
        if "generated" in case:
            res["generate_equal"] = torch.equal(model.generate(**case["generate"]), case["generated"])
    tokenizer = tf.AutoTokenizer.from_pretrained(path)
    res["tokenizer"] = tokenizer(case["text"])["input_ids"]
    for name, load in (("plain_auto", lambda: auto.from_pretrained(path)),
                       ("plain_class_ignore_sizes",
                        lambda: getattr(tf, case["class"]).from_pretrained(path, ignore_mismatched_sizes=True))):
        try:
            load()
            res[name] = "LOADED"
        except Exception as err:
            res[name] = str(err)
    out[key] = res
print("\nRESULT " + json.dumps(out))
"""


def _load_without_prunetrain(cases: dict, tmp_path: Path) -> dict:
    """Run `_CHILD` in `python -I -S` with only site-packages on the path (prunetrain is not importable there)."""
    torch.save(cases, tmp_path / "cases.pt")
    site_packages = str(Path(transformers.__file__).parents[1])
    run = subprocess.run([sys.executable, "-I", "-S", "-c", _CHILD, site_packages, str(tmp_path / "cases.pt")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
                         env={**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "OMP_NUM_THREADS": "1"})
    line = next((x for x in run.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, run.stderr[-3000:]
    out = json.loads(line.removeprefix("RESULT "))
    assert out.pop("prunetrain_importable") is False
    return out


def test_every_directory_the_trainer_writes_after_a_shrink_is_a_pruned_directory(sentences, tmp_path):
    cases = {}
    for task in TASKS:
        out = tmp_path / task
        model, tokenizer, auto, snapshots, batch = _train(task, sentences, out)
        assert sorted(snapshots) == [3, 6, 8]
        before = json.loads((out / "checkpoint-3" / "config.json").read_text())  # saved before the shrink: plain
        assert "-pruned-" not in before["model_type"] and not (out / "checkpoint-3" / "modeling_prunetrain.py").exists()
        for step in (6, 8):
            _check_pruned_directory(out / f"checkpoint-{step}", *snapshots[step])
        final = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for name in ("final", "user"):
            _check_pruned_directory(out / name, final, pt.find_heads(model).to_dict())
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        if task == "seq2seq":
            inputs["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(batch["labels"])
        with torch.no_grad():
            case = {"path": str(out / "final"), "auto": auto, "class": type(model).__name__, "inputs": inputs,
                    "logits": model(**inputs).logits, "text": "Zwei junge Männer spielen."}
            if task != "classification":
                case["generate"] = {"input_ids": batch["input_ids"][:2], "attention_mask": batch["attention_mask"][:2],
                                    "max_new_tokens": 4, "do_sample": False, "num_beams": 2}
                case["generated"] = model.generate(**case["generate"])
        cases[task] = case
        cases[f"{task}-checkpoint"] = {**case, "path": str(out / "checkpoint-8")}
        expected_ids = tokenizer(case["text"])["input_ids"]
        if task == "causal-lm-gqa":  # heads went in whole key/value groups
            assert all(s.num_heads == 4 * s.num_kv_heads for s in pt.find_heads(model))
    results = _load_without_prunetrain(cases, tmp_path)
    for key, res in results.items():
        assert res["logits_equal"] is True and res.get("generate_equal", True) is True, key
        assert res["tokenizer"] == expected_ids, key
        assert "trust_remote_code=True" in res["plain_auto"], (key, res["plain_auto"])
        assert "pruned by prunetrain" in res["plain_class_ignore_sizes"] \
            and "prunetrain.load_pruned" in res["plain_class_ignore_sizes"], (key, res["plain_class_ignore_sizes"])
    check = run_cli("export", "--check", tmp_path / "causal-lm-gqa" / "final")
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["formats"]["remote-code"] == {"possible": True}


SCRIPT = Path(__file__).with_name("dist") / "resume_from_pruned_checkpoint.py"


@pytest.mark.slow
def test_a_run_killed_after_a_shrink_resumes_from_its_checkpoint_loaded_by_plain_transformers(tmp_path,
                                                                                                multi30k_dir):
    """kill -9 after the shrink (step 4) and checkpoint-6; the resumed run loads checkpoint-6 with
    `AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True)` and ends exactly where the uninterrupted
    run ends."""
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", HF_MODULES_CACHE=str(tmp_path / "modules"))

    def run(out, *extra):
        return subprocess.run([sys.executable, str(SCRIPT), "--data", str(multi30k_dir), "--out", str(out), *extra],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
                              stdin=subprocess.DEVNULL)

    full, killed = tmp_path / "full", tmp_path / "killed"
    done = run(full)
    assert done.returncode == 0, done.stderr[-3000:]
    crashed = run(killed, "--kill-at-step", "8")
    assert crashed.returncode == -9 and not (killed / "result.json").exists()
    assert json.loads((killed / "checkpoint-6" / "config.json").read_text())["model_type"].endswith("-by-prunetrain")
    resumed = run(killed, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = (json.loads((d / "result.json").read_text()) for d in (full, killed))
    assert b["resumed_from"].endswith("checkpoint-6") and b["heads_at_start"] == 8 == a["heads_at_start"] // 2
    assert b["model_class"].endswith("modeling_prunetrain.Qwen2ForCausalLM")  # the checkpoint's own code
    assert a["events"] == [[4, "mask", 8], [4, "shrink", 8]] and b["events"] == a["events"]  # restored, not redone
    assert a["layout"] == b["layout"]
    assert a["weights"].keys() == b["weights"].keys() and all(a["weights"][k] == b["weights"][k] for k in a["weights"])
    final = pt.load_pruned(killed / "final")  # the resumed run's own save is a pruned directory too
    assert pt.find_heads(final) == pt.HeadLayout.from_dict(b["layout"])
