"""`prunetrain study ablate|one-head|cross-dataset|curves|per-kind|speed` (Michel et al. 2019 §3-5) through the real
entry point, on a tiny translation model that has memorized six Multi30k pairs (so BLEU is high and removing heads
changes it), with values checked against an independent in-process evaluation of the same masks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from conftest import run_cli

STUDY_NAMES = ("ablate", "one-head", "cross-dataset", "curves", "per-kind", "speed")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HEADS = 4
SITES = 6  # 2 encoder self + 2 decoder self + 2 cross


@pytest.fixture(scope="module")
def memorized(tmp_path_factory, multi30k_dir):
    """(model directory, data directory): a 2+2-layer, 4-head Marian model trained to reproduce six pairs, and a
    parallel-text directory whose train/valid/test splits are those six pairs (written at test time)."""
    from transformers import MarianMTModel

    from prunetrain.mt.text.data import build_dataset, make_collator, marian_config, read_parallel, train_tokenizer, \
        write_lines
    from prunetrain.mt.evaluation.translation import save_translation_model

    pairs = read_parallel(multi30k_dir, "train", limit=300)
    tokenizer = train_tokenizer(pairs, vocab_size=300)
    memo = pairs[:6]
    root = tmp_path_factory.mktemp("study-cli")
    data = root / "data"
    data.mkdir()
    for split in ("train", "valid", "test"):
        write_lines(data / f"{split}.de", [s for s, _ in memo])
        write_lines(data / f"{split}.en", [t for _, t in memo])
    torch.manual_seed(0)
    model = MarianMTModel(marian_config(tokenizer, d_model=32, ffn_dim=64, layers=2, heads=HEADS, dropout=0.0))
    dataset = build_dataset(memo, tokenizer, max_length=40)
    batch = make_collator(tokenizer, model)([dataset[i] for i in range(len(dataset))])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(120):
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    save_translation_model(model, tokenizer, root / "model")
    return root / "model", data


def _scores_with_mask(model_dir: Path, data: Path, drop: dict[str, list[int]], limit: int | None = None) -> dict:
    """`evaluate_bleu` (with per-sentence statistics) on the six valid pairs (the first `limit` of them) with the
    heads in `drop` masked, computed here (not by the study code)."""
    from prunetrain.engine.mask import HeadMask
    from prunetrain.mt.text.data import read_parallel
    from prunetrain.engine.model_dir import load_model_dir
    from prunetrain.mt.evaluation.translation import evaluate_bleu, load_model_tokenizer

    model = load_model_dir(model_dir).eval()
    tokenizer = load_model_tokenizer(model_dir, None)
    pairs = read_parallel(data, "valid", limit=limit)
    with torch.no_grad(), HeadMask.from_heads(model, drop).applied(model):
        return evaluate_bleu(model, tokenizer, pairs, batch_size=100, num_beams=1, sentence_stats=True)


def _bleu_with_mask(model_dir: Path, data: Path, drop: dict[str, list[int]], limit: int | None = None) -> float:
    return _scores_with_mask(model_dir, data, drop, limit)["bleu"]


def _p_value_by_hand(model_dir: Path, data: Path, drop: dict[str, list[int]]) -> float:
    """The paired bootstrap p-value of masking `drop` against the full model (1000 resamples, seed 0)."""
    from prunetrain.methods.significance import paired_bootstrap
    from prunetrain.mt.evaluation.bleu_stats import bleu_from_stats

    base = _scores_with_mask(model_dir, data, {})["sentence_stats"]
    return paired_bootstrap(base, _scores_with_mask(model_dir, data, drop)["sentence_stats"], bleu_from_stats)



def _study(name, model_dir, data, out, *args, env=None):
    result = run_cli("study", name, model_dir, "--data-dir", data, "--output", out,
                     *(() if name == "speed" else ("--sentences", "6")), *args, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout), result.stderr


def _is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == PNG_MAGIC


def _tensorboard(out: Path) -> tuple[dict, dict]:
    from prunetrain.utils.plots import read_image_tags, read_scalars

    return read_scalars(out / "tensorboard"), read_image_tags(out / "tensorboard")


def _main(capsys, monkeypatch, *args) -> tuple[int, str, str]:
    """`prunetrain.cli.main()` in this process (the entry point's own error handling; no interpreter start per
    case): (exit code, stdout, stderr)."""
    from prunetrain.cli import main

    monkeypatch.setattr("sys.argv", ["prunetrain", *map(str, args)])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main()
    captured = capsys.readouterr()
    return exited.value.code, captured.out, captured.err


@pytest.fixture(scope="module")
def ablation_run(tmp_path_factory, memorized):
    """`prunetrain study ablate` on the memorized model with progress bars on: (output dir, summary, stderr)."""
    model_dir, data = memorized
    out = tmp_path_factory.mktemp("ablate") / "ablate"
    summary, stderr = _study("ablate", model_dir, data, out, env={"PRUNETRAIN_PROGRESS": "1"})
    return out, summary, stderr


def test_every_study_has_its_own_help(capsys, monkeypatch):
    shown = run_cli("study", "--help")
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    for name in STUDY_NAMES:
        assert name in text
    own = {"ablate": ("--threshold", "--sentences", "--bootstrap-samples", "--alpha"),
           "one-head": ("--ablation", "--bootstrap-samples", "--alpha"),
           "cross-dataset": ("--other-data-dir", "--other-split", "--bootstrap-samples", "--alpha"), "curves": ("--seeds", "--fractions"),
           "per-kind": ("--fractions",), "speed": ("--batch-sizes", "--repeats", "--generate")}
    for name, flags in own.items():
        code, stdout, stderr = _main(capsys, monkeypatch, "study", name, "--help")
        help_text = " ".join(stdout.split())
        assert code == 0 and f"study {name} [OPTIONS]" in help_text, (name, stderr)
        for flag in ("--data-dir", "--output", *flags):
            assert flag in help_text, (name, flag)
    code, stdout, _ = _main(capsys, monkeypatch, "study", "ablate", "--help")
    assert "--other-data-dir" not in stdout and "--seeds" not in stdout  # each study shows only its options


def test_ablate_matches_masking_by_hand_with_bar_figure_and_tensorboard(memorized, ablation_run):
    model_dir, data = memorized
    out, summary, stderr = ablation_run
    result = json.loads((out / "ablation.json").read_text())
    assert summary["study"] == result["study"] == "ablate" and summary["output"] == str(out)
    base, rows = result["base"], result["heads"]
    assert summary["base"] == base and base > 50  # the six pairs are memorized
    assert len(rows) == SITES * HEADS == result["summary"]["num_heads"] == summary["summary"]["num_heads"]
    assert len({(r["site"], r["head"]) for r in rows}) == len(rows)
    assert {r["kind"] for r in rows} == {"encoder_self", "decoder_self", "cross"}
    deltas = [r["delta"] for r in rows]
    for row in rows:
        assert 0 <= row["value"] <= 100 and row["delta"] == pytest.approx(row["value"] - base, abs=1e-9)
    assert min(deltas) < -0.5  # some head matters to the memorized translations
    assert result["summary"]["num_changed"] == sum(abs(d) > 0.5 for d in deltas) > 0
    assert result["summary"]["num_improving"] == sum(d > 0 for d in deltas)
    worst = min(rows, key=lambda r: r["delta"])
    assert _bleu_with_mask(model_dir, data, {worst["site"]: [worst["head"]]}) == pytest.approx(worst["value"],
                                                                                               abs=1e-9)
    # each change is tested for significance (paired bootstrap over the sentences), as in the paper's Table 1
    assert worst["p_value"] == _p_value_by_hand(model_dir, data, {worst["site"]: [worst["head"]]}) < 0.05
    assert {r["p_value"] for r in rows if r["delta"] == 0} <= {1.0}
    test = result["summary"]["significance"]
    assert test["samples"] == 1000 and test["alpha"] == 0.01 and result["args"]["bootstrap_samples"] == 1000
    assert result["summary"]["num_significant"] == sum(r["p_value"] < 0.01 for r in rows)
    assert _bleu_with_mask(model_dir, data, {}) == pytest.approx(base, abs=1e-9)
    assert _is_png(out / "ablation_hist.png")
    scalars, images = _tensorboard(out)
    assert [v for _, v in sorted(scalars["ablate/delta"])] == pytest.approx(deltas, abs=1e-4)
    assert images == {"ablate/ablation_hist": 1}
    assert re.search(r"ablate: +\d+%\|.*\| \d+/25 ", stderr)  # the progress bar (25 evaluations), not a line each
    assert not re.search(r"^ablate .* head \d+: ", stderr, flags=re.M)


def test_ablate_resumes_from_saved_units_and_refuses_other_arguments(tmp_path, memorized, ablation_run):
    model_dir, data = memorized
    full = json.loads((ablation_run[0] / "ablation.json").read_text())
    out = tmp_path / "resumed"
    out.mkdir()
    units = {"base#stats": _scores_with_mask(model_dir, data, {})["sentence_stats"], "base": full["base"]}
    for r in full["heads"][:10]:
        units.update({f"{r['site']}/{r['head']}#p": r["p_value"], f"{r['site']}/{r['head']}": r["value"]})
    marked = f"{full['heads'][3]['site']}/{full['heads'][3]['head']}"
    units[marked] = -1.0  # a value no evaluation gives: it can only come from the saved unit
    (out / "ablation.partial.json").write_text(json.dumps({"args": full["args"], "units": units}))
    summary, _ = _study("ablate", model_dir, data, out)
    result = json.loads((out / "ablation.json").read_text())
    assert result["heads"][3]["value"] == -1.0 and not (out / "ablation.partial.json").exists()
    for got, want in zip(result["heads"][4:], full["heads"][4:]):
        assert got["value"] == pytest.approx(want["value"], abs=1e-9) and got["p_value"] == want["p_value"]
    again = run_cli("study", "ablate", model_dir, "--data-dir", data, "--output", out, "--sentences", "5")
    lines = again.stderr.strip().splitlines()
    assert again.returncode == 2 and len(lines) == 1 and not again.stdout, again.stderr
    assert re.search(r"holds a run with other arguments: sentences \(saved 6, now 5\)", lines[0]), lines[0]


def test_one_head_reuses_the_ablation_or_tries_each_head(tmp_path, memorized, ablation_run):
    model_dir, data = memorized
    ablation = json.loads((ablation_run[0] / "ablation.json").read_text())
    summary, _ = _study("one-head", model_dir, data, tmp_path / "reused", "--ablation",
                        ablation_run[0] / "ablation.json")
    result = json.loads((tmp_path / "reused" / "one_head_per_layer.json").read_text())
    assert summary["study"] == result["study"] == "one-head" and result["summary"]["head_choice"] == "ablation"
    rows = result["layers"]
    assert len(rows) == SITES and all(len(r["tried"]) == 1 for r in rows)
    for row in rows:
        deltas = {r["head"]: r["delta"] for r in ablation["heads"] if r["site"] == row["site"]}
        assert row["kept_head"] == min(deltas, key=deltas.get)
    row = rows[0]
    others = {row["site"]: [k for k in range(HEADS) if k != row["kept_head"]]}
    assert _bleu_with_mask(model_dir, data, others) == pytest.approx(row["value"], abs=1e-9)
    assert row["p_value"] == _p_value_by_hand(model_dir, data, others)
    assert _is_png(tmp_path / "reused" / "one_head_per_layer.png")
    assert _tensorboard(tmp_path / "reused")[1] == {"one-head/one_head_per_layer": 1}

    _study("one-head", model_dir, data, tmp_path / "tried")
    row = json.loads((tmp_path / "tried" / "one_head_per_layer.json").read_text())["layers"][0]
    by_kept = {h: _bleu_with_mask(model_dir, data, {row["site"]: [k for k in range(HEADS) if k != h]})
               for h in range(HEADS)}
    assert by_kept[row["kept_head"]] == pytest.approx(row["value"], abs=1e-9)
    assert row["value"] == pytest.approx(max(by_kept.values()), abs=1e-9)
    table = (tmp_path / "tried" / "one_head_per_layer.md").read_text()
    assert table.count("\n| ") == SITES + 1  # header + one row per site (separator starts with "|---")


@pytest.mark.slow
def test_curves_per_kind_cross_dataset_and_speed(tmp_path, memorized, ablation_run):
    model_dir, data = memorized
    summary, _ = _study("curves", model_dir, data, tmp_path / "curves", "--seeds", "2", "--fractions", "0,0.5",
                        "--num-batches", "1")
    result = json.loads((tmp_path / "curves" / "pruning_curves.json").read_text())
    assert set(result["curves"]) == {"importance", "random_seed0", "random_seed1"} == set(summary["curves"])
    base = _bleu_with_mask(model_dir, data, {})
    for name, curve in result["curves"].items():
        assert [p["fraction"] for p in curve["points"]] == [0.0, 0.5], name
        assert curve["points"][0]["value"] == pytest.approx(base, abs=1e-9), name  # nothing pruned: the full model
    assert [p["heads_kept"] for p in result["curves"]["importance"]["points"]] == [SITES * HEADS, SITES * HEADS // 2]
    assert summary["summary"]["importance_within_threshold"] in (0.0, 0.5)
    assert len(result["random"]["mean"]) == 2 and _is_png(tmp_path / "curves" / "pruning_curves.png")
    assert "curves/importance" in _tensorboard(tmp_path / "curves")[0]

    kinds, _ = _study("per-kind", model_dir, data, tmp_path / "kinds", "--fractions", "0,0.5", "--num-batches", "1")
    assert set(kinds["curves"]) == {"encoder_self", "decoder_self", "cross"}
    assert kinds["summary"]["most_sensitive"] in kinds["curves"] and _is_png(tmp_path / "kinds" / "per_kind_curves.png")

    cross, _ = _study("cross-dataset", model_dir, data, tmp_path / "cross", "--other-data-dir", data,
                      "--other-split", "test")  # test holds the same pairs as valid: identical ablation effects
    assert cross["num_heads"] == SITES * HEADS and cross["study"] == "cross-dataset"
    assert cross["pearson"] == pytest.approx(1.0) and cross["spearman"] == pytest.approx(1.0)
    assert _is_png(tmp_path / "cross" / "cross_dataset.png")
    ablation = json.loads((ablation_run[0] / "ablation.json").read_text())
    reused, _ = _study("cross-dataset", model_dir, data, tmp_path / "reused", "--other-data-dir", data,
                       "--other-split", "test", "--ablation", ablation_run[0] / "ablation.json")
    heads = json.loads((tmp_path / "reused" / "cross_dataset.json").read_text())["heads"]
    assert [h["delta_a"] for h in heads] == [r["delta"] for r in ablation["heads"]]  # taken from the file as is
    assert [h["p_a"] for h in heads] == [r["p_value"] for r in ablation["heads"]]
    assert [h["p_b"] for h in heads] == [r["p_value"] for r in ablation["heads"]]  # the same six pairs, same test
    assert reused["pearson"] == pytest.approx(1.0)
    fewer, _ = _study("cross-dataset", model_dir, data, tmp_path / "fewer", "--other-data-dir", data,
                      "--other-split", "test", "--other-sentences", "3", "--ablation", ablation_run[0] / "ablation.json")
    saved = json.loads((tmp_path / "fewer" / "cross_dataset.json").read_text())
    assert saved["args"]["a"]["sentences"] == 6 and saved["args"]["b"]["sentences"] == 3
    assert saved["base"] == [pytest.approx(base, abs=1e-9), pytest.approx(_bleu_with_mask(model_dir, data, {}, 3),
                                                                            abs=1e-9)]
    assert saved["base"][1] != pytest.approx(base, abs=1e-6)  # three pairs score differently from six

    speed, stderr = _study("speed", model_dir, data, tmp_path / "speed", "--fractions", "0.5", "--batch-sizes", "2",
                           "--seq-lens", "8", "--repeats", "1", "--num-batches", "1")
    assert [(t["fraction"], t["heads_kept"]) for t in speed["table"]] == [(0.5, SITES * HEADS // 2)]
    assert speed["paper"]["speedup"] == 1.175 and "| 50 % |" in stderr and _is_png(tmp_path / "speed" / "speed.png")


def test_bad_study_arguments_are_one_line_and_exit_2(tmp_path, memorized, ablation_run, capsys, monkeypatch):
    model_dir, data = memorized
    ablation = ablation_run[0] / "ablation.json"
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "not-ablation.json").write_text('{"study": "curves"}')
    cases = [
        (("ablate", model_dir, "--data-dir", data, "--sentences", "0"), r"--sentences: 0 is not allowed"),
        (("ablate", model_dir, "--data-dir", tmp_path / "nowhere"), r"--data-dir: '.*nowhere' is not a directory"),
        (("ablate", tmp_path / "no-model", "--data-dir", data), r"model: '.*no-model'"),
        (("ablate", model_dir, "--data-dir", data, "--output", tmp_path / "a-file"), r"--output: '.*a-file' is a file"),
        (("ablate", model_dir, "--data-dir", data, "--threshold", "-1"), r"--threshold: -1.0 is not allowed"),
        (("ablate", model_dir, "--data-dir", data, "--bootstrap-samples", "-1"),
         r"--bootstrap-samples: -1 is not allowed; expected an integer >= 0"),
        (("one-head", model_dir, "--data-dir", data, "--alpha", "0"),
         r"--alpha: 0.0 is not allowed; expected a significance level in \(0, 1\)"),
        (("cross-dataset", model_dir, "--data-dir", data, "--other-data-dir", data, "--ablation", ablation,
          "--bootstrap-samples", "50"), r"--ablation: it was made with 1000 bootstrap resamples and this study "
                                        r"tests with 50 resamples"),
        (("one-head", model_dir, "--data-dir", data, "--ablation", tmp_path / "none.json"),
         r"--ablation: .* not a file"),
        (("one-head", model_dir, "--data-dir", data, "--ablation", tmp_path / "not-ablation.json"),
         r"--ablation: .* is not the ablation.json of `prunetrain study ablate`"),
        (("cross-dataset", model_dir, "--data-dir", data, "--other-data-dir", tmp_path / "nowhere"),
         r"--other-data-dir: '.*nowhere' is not a directory"),
        (("cross-dataset", model_dir, "--data-dir", data, "--other-data-dir", data, "--ablation", ablation,
          "--sentences", "5"), r"--ablation: '.*ablation.json' was made with other settings: sentences 6 \(here 5\)"),
        (("cross-dataset", model_dir, "--data-dir", data, "--other-data-dir", data, "--other-sentences", "0"),
         r"--other-sentences: 0 is not allowed"),
        (("curves", model_dir, "--data-dir", data, "--fractions", "0,x"), r"--fractions: '0,x' is not a comma-sep"),
        (("curves", model_dir, "--data-dir", data, "--seeds", "0"), r"--seeds: 0 is not allowed"),
        (("per-kind", model_dir, "--data-dir", data, "--fractions", "0,2"), r"--fractions: "),
        (("speed", model_dir, "--data-dir", data, "--fractions", "0"), r"--fractions: '0' holds no fraction > 0"),
        (("speed", model_dir, "--data-dir", data, "--generate", "sample"), r"--generate: 'sample' is not one of"),
    ]
    for args, pattern in cases:
        out = tmp_path / "out"
        has_output = "--output" in args
        code, stdout, stderr = _main(capsys, monkeypatch, "study", *args, *(() if has_output else ("--output", out)))
        assert code == 2, (args, stderr[-2000:])
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in stderr and not stdout, (args, stderr)
        assert re.search(pattern, lines[0]), (args, lines[0])
        assert not out.exists(), args  # nothing written
    code, stdout, stderr = _main(capsys, monkeypatch, "study", "everything", model_dir, "--data-dir", data)
    assert code == 2 and not stdout and stderr.strip() == (
        "prunetrain: error: study: 'everything' is not one of ablate, one-head, cross-dataset, curves, per-kind, "
        "speed.")
