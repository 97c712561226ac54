"""The speed/quality frontier (`prunetrain.mt.evaluation.frontier`, `benchmarks/bench_frontier.py`): real trained
smoke models (the full one and the pruned one of the smoke recipe) exported to CTranslate2, scored as served in
float32 and int8 on real Multi30k test sets, timed one translator per process; the JSON, table and figure written."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from prunetrain.bench.environment import machine
from prunetrain.mt.evaluation.frontier import frontier, frontier_figure, frontier_table, served_model_dir
from prunetrain.mt.evaluation.translation import score_translations
from prunetrain.mt.text.data import read_parallel

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def runs(full_smoke_run, smoke_recipe_run):
    (full, made), (pruned, done) = full_smoke_run, smoke_recipe_run
    assert made.returncode == 0 and done.returncode == 0, (made.stderr[-2000:], done.stderr[-2000:])
    return full, pruned


@pytest.mark.slow
def test_every_model_is_scored_as_served_and_timed(runs, multi30k_dir, tmp_path, monkeypatch):
    from prunetrain.export.ctranslate2 import export_ctranslate2, translate_ctranslate2
    from prunetrain.mt.evaluation.ctranslate2_speed import gemm_backend
    from prunetrain.mt.evaluation.translation import find_tokenizer_dir, load_translation_model

    full, pruned = runs
    sets = {"test": read_parallel(multi30k_dir, "test")[:40], "valid": read_parallel(multi30k_dir, "valid")[:30]}
    lines = []
    result = frontier({"full": full, "pruned": pruned}, sets, beams=2, repeats=2, threads=1, progress=lines.append)
    rows = {(r["name"], r["compute_type"]): r for r in result["rows"]}
    assert list(rows) == [("full", "float32"), ("full", "int8"), ("pruned", "float32"), ("pruned", "int8")]
    assert rows["full", "float32"]["model_dir"] == str(full / "full")
    assert rows["pruned", "float32"]["model_dir"] == str(pruned / "pruned")
    assert rows["pruned", "float32"]["heads_kept"] < rows["full", "float32"]["heads_kept"]
    assert rows["full", "float32"]["speedup"] == 1.0
    for row in result["rows"]:
        assert len(row["seconds"]) == 2 and row["sentences_per_s"] == pytest.approx(40 / row["median_s"])
        assert row["speedup"] == pytest.approx(rows["full", "float32"]["median_s"] / row["median_s"])
    # the float32 scores are those of the model in CTranslate2 at beam 2 on each set, scored by sacreBLEU
    model_dir = served_model_dir(pruned)
    export_ctranslate2(load_translation_model(model_dir), tmp_path / "ct2", find_tokenizer_dir(model_dir))
    for split, pairs in sets.items():
        hypotheses = translate_ctranslate2(tmp_path / "ct2", [s for s, _ in pairs], num_beams=2)
        expected = score_translations(hypotheses, [t for _, t in pairs])
        assert rows["pruned", "float32"]["scores"][split] == {"bleu": expected["bleu"], "chrf": expected["chrf"]}
    # the matrix-multiply library CTranslate2 ran, as it reports it; CT2_USE_MKL=0 makes it oneDNN on any x86 CPU
    assert result["settings"]["gemm_backend"] == gemm_backend(tmp_path / "ct2") is not None
    if platform.machine().lower() in ("x86_64", "amd64"):
        monkeypatch.setenv("CT2_USE_MKL", "0")
        assert gemm_backend(tmp_path / "ct2") == "DNNL"
    assert result["settings"]["timing_split"] == "test" and result["settings"]["test_sets"] == {"test": 40,
                                                                                                 "valid": 30}
    table = frontier_table(result).splitlines()
    assert len(table) == 6 and "test BLEU (chrF)" in table[0] and "| pruned | int8 |" in table[5]
    figure = frontier_figure(result, tmp_path / "frontier.png")
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any("timing round 2 of 2" in line for line in lines)


def test_a_directory_without_a_model_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"^models: .* holds no model \(no config.json, pruned/config.json or "
                                         r"full/config.json\)"):
        served_model_dir(tmp_path)
    with pytest.raises(ValueError, match=r"^frontier: give at least one model and one test set\.$"):
        frontier({}, {"test": [("a", "b")]})


@pytest.mark.slow
def test_the_benchmark_script_writes_json_table_and_figure(runs, multi30k_dir, tmp_path):
    full, pruned = runs
    out = tmp_path / "frontier.json"
    done = subprocess.run([sys.executable, "benchmarks/bench_frontier.py", "--model", f"start={full}", "--model",
                           f"pruned={pruned}", "--data-dir", str(multi30k_dir), "--splits", "test", "--quick",
                           "--threads", "1", "--compute-types", "float32", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [r["name"] for r in result["rows"]] == ["start", "pruned"] and result["quick"] is True
    assert result["settings"]["test_sets"] == {"test": 100} and result["machine"]["cpu_count"] >= 1
    here = machine()  # every benchmark's start record names the machine (benchmarks/_common.py setup)
    assert {"busy_at_start", "loadavg_at_start", *here} <= set(result["machine"]), result["machine"]
    assert {key: result["machine"][key] for key in here} == here
    assert out.with_suffix(".md").read_text().count("\n") == 4 and out.with_suffix(".png").is_file()
    assert "| pruned | float32 |" in done.stdout
    bad = subprocess.run([sys.executable, "benchmarks/bench_frontier.py", "--model", "start", "--quick"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and bad.stderr.strip() == "--model: 'start' is not NAME=DIRECTORY.", bad.stderr
