"""Side-by-side comparison of recipe runs (`prunetrain compare RUN... --output DIR`): e.g. the main job with pruning
during training against the same recipe with pruning off.

For every run: heads, parameters, steps, training time (optimizer steps only, see
`prunetrain.training.metric_points`), wall time, final test BLEU and test decode speed, and the steps per second of
every stretch between shrinks. Against the first run (the reference):

- **equal steps**: BLEU of both at every step where both evaluated the test split;
- **equal training time**: each run's final BLEU beside the reference's BLEU after the same training time, read at the
  reference's evaluation points just before and after that time and linearly interpolated between them (both points
  are listed, so nothing hides in the interpolation);
- **drift between the runs**: runs taken one after the other on a shared machine see different machine speeds. Where
  both runs evaluated at a step before either changed its model (no pruning event, no gates yet), they had done the
  same computation, so the ratio of their training times there measures the drift; the equal-time comparison is
  repeated with the run's time divided by that ratio.

- **equal training FLOPs** (drift-free): runs that share a name are seeds of one arm; each arm's test (and, where
  recorded, validation) BLEU at the FLOP points every run evaluated, its final scores as mean ± sd over seeds, and a
  paired bootstrap between the final models of the reference arm and each other arm, seed by seed
  (`prunetrain.mt.comparison.compare_arms`);
- **every test set and the seeds together**: BLEU and chrF on every test set all runs scored, a paired t-test and an
  exact sign-flip test across seeds per test set and metric, and the arm validation chooses
  (`prunetrain.mt.comparison.compare_seeds`).

Writes `compare.json`, `compare.md` and `compare.png` (BLEU against training FLOPs and training time, heads per kind
over steps).
"""

from __future__ import annotations

import json
from pathlib import Path

from prunetrain.mt.comparison.compare_arms import cell


def load_run(path: str | Path) -> dict:
    """`results.json` of a finished recipe run directory (one clear line when it is not one)."""
    path = Path(path)
    results = path / "results.json"
    if not results.is_file():
        raise ValueError(f"run: {str(path)!r} has no results.json; give the directory of a finished recipe run.")
    from prunetrain.utils.files import read_json

    data = read_json(results, "run")  # strict JSON object; a damaged file is named
    if "bleu_over_training" not in data:
        raise ValueError(f"run: {str(path)!r} was written by an older prunetrain without BLEU over training; "
                         f"run the recipe again to compare it.")
    records = data["bleu_over_training"]
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ValueError(f"run: {str(results)!r} field 'bleu_over_training' is not a list of records; the file is "
                         f"damaged.")
    check_results_fields(results, data)
    return data


_NUMBER = (int, float)
_RECORD_FIELDS = {"step": int, "step_seconds": _NUMBER, "bleu": _NUMBER, "heads": int}
_STRETCH_FIELDS = {"from_step": int, "to_step": int, "heads": int}
_EVENT_FIELDS = {"step": int, "per_kind_before": dict, "per_kind_after": dict}
_OPTIONAL_NUMBERS = ("steps", "train_step_minutes", "train_minutes", "total_minutes", "parameters_final", "train_flops",
                     "resumed_from_step", "test_pruned.chrf", "test_pruned.sentences_per_second",
                     "bleu_over_training[].flops", "bleu_over_training[].flops_target",
                     "bleu_over_training[].valid_bleu", "bleu_over_training[].valid_chrf",
                     "step_rate[].steps_per_second")


def check_results_fields(results: Path, data: dict) -> None:
    """Every field of `results.json` the comparison reads is there with its type, else one line naming the file
    and the field (never a bare key name from deep inside the comparison)."""
    def fail(field: str, what: str):
        raise ValueError(f"run: {str(results)!r} field {field!r} {what}; the file is damaged or not the results.json "
                         f"of a finished recipe run.")

    def check(field: str, value, kind) -> None:
        if isinstance(value, bool) or not isinstance(value, kind):
            names = "a number" if kind is _NUMBER else {int: "an integer", dict: "an object"}[kind]
            fail(field, "is missing" if value is None else f"is {value!r}, not {names}")

    if not data["bleu_over_training"]:
        fail("bleu_over_training", "holds no record")
    check("test_pruned", data.get("test_pruned"), dict)
    check("test_pruned.bleu", data["test_pruned"].get("bleu"), _NUMBER)
    check("heads_kept", data.get("heads_kept"), int)
    for index, record in enumerate(data["bleu_over_training"]):
        for field, kind in _RECORD_FIELDS.items():
            check(f"bleu_over_training[{index}].{field}", record.get(field), kind)
    for name, fields in (("step_rate", _STRETCH_FIELDS), ("pruning_events", _EVENT_FIELDS)):
        entries = data.get(name) or []
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            fail(name, "is not a list of records")
        for index, entry in enumerate(entries):
            for field, kind in fields.items():
                check(f"{name}[{index}].{field}", entry.get(field), kind)
    from prunetrain.mt.comparison.compare_seeds import check_score_fields

    check_score_fields(data, fail)  # final_scores, valid_split, test_splits (runs written before them have none)
    for name in ("recipe", "kept_per_kind"):
        if data.get(name) is not None and not isinstance(data[name], dict):
            fail(name, f"is {data[name]!r}, not an object")
    for field in _OPTIONAL_NUMBERS:  # None or a number
        parent, _, key = field.rpartition(".")
        for prefix, holder in _holders(data, parent):
            value = holder.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, _NUMBER)):
                fail(prefix + key, f"is {value!r}, not a number")


def _holders(data: dict, parent: str) -> list[tuple[str, dict]]:
    """(field prefix, object) of `parent`: "" the file itself, "x" one object, "x[]" every record of a list."""
    if not parent:
        return [("", data)]
    if parent.endswith("[]"):
        name = parent[:-2]
        return [(f"{name}[{index}].", entry) for index, entry in enumerate(data.get(name) or [])]
    return [(f"{parent}.", data[parent])]


def bleu_at_time(records: list[dict], seconds: float) -> dict:
    """The run's test BLEU after `seconds` of training steps: the records just before and after, and the linear
    interpolation between them (None beyond the run's last record)."""
    records = sorted(records, key=lambda r: r["step_seconds"])
    before = [r for r in records if r["step_seconds"] <= seconds]
    after = [r for r in records if r["step_seconds"] >= seconds]
    low, high = (before[-1] if before else None), (after[0] if after else None)
    if low is None or high is None:
        value = None
    elif high["step_seconds"] == low["step_seconds"]:
        value = low["bleu"]
    else:
        share = (seconds - low["step_seconds"]) / (high["step_seconds"] - low["step_seconds"])
        value = low["bleu"] + share * (high["bleu"] - low["bleu"])
    return {"seconds": seconds, "bleu": value, "before": _point(low), "after": _point(high)}


def _point(record: dict | None) -> dict | None:
    return None if record is None else {"step": record["step"], "step_seconds": record["step_seconds"],
                                        "bleu": record["bleu"]}


def unchanged_until(results: dict) -> int:
    """The last step before which the run trained the model as built (no pruning event; gates not yet joined)."""
    events = [e["step"] for e in results.get("pruning_events") or []]
    pruning = (results.get("recipe") or {}).get("pruning") or {}
    if pruning.get("method") == "l0":
        events.append(int(pruning.get("l0_start_step", 0)))
    return min(events, default=10**12)


def drift(reference: dict, other: dict) -> dict | None:
    """Training-time ratio other/reference at the last step both evaluated while neither had changed its model."""
    limit = min(unchanged_until(reference), unchanged_until(other))
    ref = {r["step"]: r for r in reference["bleu_over_training"] if r["step"] <= limit}
    same = [r for r in other["bleu_over_training"] if r["step"] in ref]
    if not same:
        return None
    point = max(same, key=lambda r: r["step"])
    base = ref[point["step"]]
    return {"step": point["step"], "step_seconds": point["step_seconds"], "reference_step_seconds":
            base["step_seconds"], "factor": point["step_seconds"] / base["step_seconds"]}


def summarize(name: str, results: dict) -> dict:
    final = results["test_pruned"]
    return {"run": name, "heads": results["heads_kept"], "neurons": results.get("neurons_kept"),
            "parameters": results.get("parameters_final"),
            "steps": results.get("steps"), "train_step_minutes": results.get("train_step_minutes"),
            "train_minutes": results.get("train_minutes"), "total_minutes": results.get("total_minutes"),
            "resumed_from_step": results.get("resumed_from_step"), "bleu": final["bleu"], "chrf": final.get("chrf"),
            "num_beams": final.get("num_beams"),
            "decode_sentences_per_second": final.get("sentences_per_second"),
            "kept_per_kind": results.get("kept_per_kind"), "step_rate": results.get("step_rate") or []}


def compare_runs(runs: dict[str, dict]) -> dict:
    """The comparison of `runs` ({name: results}; the first is the reference)."""
    names = list(runs)
    reference = runs[names[0]]
    ref_records = reference["bleu_over_training"]
    out = {"reference": names[0], "runs": [summarize(n, r) for n, r in runs.items()], "equal_steps": [],
           "equal_time": []}
    for name in names[1:]:
        records = runs[name]["bleu_over_training"]
        ref_by_step = {r["step"]: r for r in ref_records}
        for r in records:
            if r["step"] in ref_by_step:
                out["equal_steps"].append({"run": name, "step": r["step"], "bleu": r["bleu"], "heads": r["heads"],
                                           "reference_bleu": ref_by_step[r["step"]]["bleu"],
                                           "delta": r["bleu"] - ref_by_step[r["step"]]["bleu"]})
        last = max(records, key=lambda r: r["step"])
        at = bleu_at_time(ref_records, last["step_seconds"])
        entry = {"run": name, "step": last["step"], "step_seconds": last["step_seconds"], "bleu": last["bleu"],
                 "reference": at, "delta": None if at["bleu"] is None else last["bleu"] - at["bleu"],
                 "drift": drift(reference, runs[name])}
        if entry["drift"]:
            corrected = last["step_seconds"] / entry["drift"]["factor"]
            at_corrected = bleu_at_time(ref_records, corrected)
            entry["corrected"] = {"step_seconds": corrected, "reference": at_corrected,
                                  "delta": None if at_corrected["bleu"] is None else last["bleu"] - at_corrected["bleu"]}
        out["equal_time"].append(entry)
    return out


def comparison_markdown(comparison: dict) -> str:
    from prunetrain.mt.comparison.compare_arms import arms_markdown

    ref = cell(comparison["reference"])
    lines = ["# Runs side by side", ""] + (arms_markdown(comparison) + ["", "## Every run"]
                                            if comparison.get("arms") else []) + ["", "| run | heads | FFN neurons | parameters | steps | training min (steps only) | wall min "
             "(training) | whole run min | test BLEU | decode sent/s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in comparison["runs"]:
        params = f"{r['parameters'] / 1e6:.2f} M" if r.get("parameters") else ""
        # a resumed run's wall minutes are those of the resumed part (its optimizer-step minutes span the whole run)
        part = "" if r.get("resumed_from_step") is None else f" (resumed part, from step {r['resumed_from_step']})"
        neurons = "all" if r.get("neurons") is None else r["neurons"]  # a run that pruned no FFN keeps them all
        lines.append(f"| {cell(r['run'])} | {r['heads']} | {neurons} | {params} | {r['steps']} | {_num(r['train_step_minutes'])} | "
                     f"{_num(r['train_minutes'])}{part} | {_num(r['total_minutes'])}{part} | {r['bleu']:.2f} | "
                     f"{_num(r['decode_sentences_per_second'])} |")
    lines += ["", "## Steps per second between shrinks", "", "| run | steps | heads | steps/s | × first stretch |",
              "|---|---|---|---|---|"]
    for r in comparison["runs"]:
        first = (r["step_rate"] or [{}])[0].get("steps_per_second")
        for g in r["step_rate"]:
            rate = g.get("steps_per_second")
            ratio = f"{rate / first:.2f}" if rate and first else ""
            lines.append(f"| {cell(r['run'])} | {g['from_step']}–{g['to_step']} | {g['heads']} | {_num(rate, 3)} | "
                         f"{ratio} |")
    if comparison["equal_steps"]:
        lines += ["", f"## Equal steps (test BLEU; reference: {ref})", "", "| run | step | heads | BLEU | reference "
                  "BLEU | Δ |", "|---|---|---|---|---|---|"]
        for e in comparison["equal_steps"]:
            lines.append(f"| {cell(e['run'])} | {e['step']} | {e['heads']} | {e['bleu']:.2f} | "
                         f"{e['reference_bleu']:.2f} | {e['delta']:+.2f} |")
    if comparison["equal_time"]:
        lines += ["", f"## Equal training time (reference: {ref})", "", "| run | its last step | training min | BLEU |"
                  " reference BLEU at that time | reference points used | Δ |", "|---|---|---|---|---|---|---|"]
        for e in comparison["equal_time"]:
            at = e["reference"]
            used = " and ".join(f"step {p['step']} ({p['step_seconds'] / 60:.1f} min, {p['bleu']:.2f})"
                                for p in (at["before"], at["after"]) if p)
            value = "beyond the reference's run" if at["bleu"] is None else f"{at['bleu']:.2f}"
            delta = "" if e["delta"] is None else f"{e['delta']:+.2f}"
            lines.append(f"| {cell(e['run'])} | {e['step']} | {e['step_seconds'] / 60:.1f} | {e['bleu']:.2f} | "
                         f"{value} | {used} | {delta} |")
        drifts = [e for e in comparison["equal_time"] if e.get("drift")]
        if drifts:
            lines += ["", "Drift between the runs (the same computation timed in both, before either changed its "
                      "model) and the equal-time comparison with it taken out:", "",
                      "| run | same-work step | its min | reference min | time ratio | corrected training min | "
                      "reference BLEU then | Δ |", "|---|---|---|---|---|---|---|---|"]
            for e in drifts:
                d, c = e["drift"], e["corrected"]
                ref_bleu = "beyond the reference's run" if c["reference"]["bleu"] is None else \
                    f"{c['reference']['bleu']:.2f}"
                delta = "" if c["delta"] is None else f"{c['delta']:+.2f}"
                lines.append(f"| {cell(e['run'])} | {d['step']} | {d['step_seconds'] / 60:.2f} | "
                             f"{d['reference_step_seconds'] / 60:.2f} | {d['factor']:.3f} | "
                             f"{c['step_seconds'] / 60:.1f} | {ref_bleu} | {delta} |")
    return "\n".join(lines + [""])


def run_labels(names: list[str], runs: list[dict]) -> list[str]:
    """One label per run: its name, with its seed where several runs share the name (`x (seed 1)`). Two runs that
    would get one label (a name written as another run's label, e.g. names 'x (seed 1),x,x') are refused: the
    comparison keys its rows by label, and one run would silently replace the other."""
    from prunetrain.mt.comparison.compare_arms import run_seed

    seeded = {n for n in names if names.count(n) > 1}
    labels = [f"{n} (seed {run_seed(r)})" if n in seeded else n for n, r in zip(names, runs)]
    for index, label in enumerate(labels):
        if label in labels[:index]:
            raise ValueError(f"names: runs {labels.index(label) + 1} and {index + 1} would both be shown as "
                             f"{label!r} ({names!r}); give the runs distinct names.")
    return labels


def _plot_label(name: str) -> str:
    """A run's name as a matplotlib legend label shown as written: `$` is not mathtext, a leading `_` not hidden."""
    name = name.replace("$", "\\$")
    return " " + name if name.startswith("_") else name


def _num(value, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def check_distinct_runs(run_dirs: list[str | Path], loaded: list[dict]) -> None:
    """Each run compared once: paths are resolved first (a symlink or `a/../a` names the run it points to), and two
    directories whose `results.json` hold the same results (`loaded`, as `load_run` read them: a copy) are one run
    as well."""
    seen: dict[Path, int] = {}
    contents: dict[str, int] = {}
    for index, (run, results) in enumerate(zip(run_dirs, loaded)):
        resolved = Path(run).resolve()
        if resolved in seen:
            first = run_dirs[seen[resolved]]
            raise ValueError(f"runs: {str(run)!r} is the same directory as {str(first)!r} (both resolve to "
                             f"{str(resolved)!r}); give each run once.")
        seen[resolved] = index
        key = json.dumps(results, sort_keys=True, default=str)
        if key in contents:
            first = run_dirs[contents[key]]
            raise ValueError(f"runs: {str(run)!r} holds the same results.json as {str(first)!r} (a copy of one "
                             f"run); give each run once.")
        contents[key] = index


def write_comparison(run_dirs: list[str | Path], output: str | Path, names: list[str] | None = None, *,
                     samples: int | None = None, validation_only: bool = False,
                     max_total_flops: float | None = None) -> dict:
    """Compare finished recipe runs (the first is the reference) and write `compare.json`, `compare.md` and
    `compare.png` into `output` (created; an existing non-empty directory is refused before anything is written).

    Args:
        run_dirs: run directories (each with `results.json`), the reference first; at least two.
        output: the directory to write.
        names: a name per run (default: the directories' names); runs that share a name are seeds of one arm,
            summarised over seeds and tested against the first arm (`prunetrain.mt.comparison.compare_arms`).
        samples: resamples of the paired bootstrap between final models (default 1000); a validation-only
            comparison runs no bootstrap and refuses it.
        validation_only: keep only what a choice may look at (`prunetrain.mt.comparison.compare_validation`): no test score
            is computed or written, and no figure (it plots test BLEU).
        max_total_flops: a budget for the choice on validation, in training plus teacher FLOPs (an arm's means over
            its seeds): the arm chosen is the best within it, and the best over it is named beside it.
    """
    from prunetrain.mt.comparison.compare_arms import compare_arms
    from prunetrain.mt.run.report import training_figure
    from prunetrain.utils.output_paths import replace_directory, staging_directory
    from prunetrain.utils.validate import check_bool, check_int, check_positive_float

    check_bool("validation_only", validation_only)
    if max_total_flops is not None:
        max_total_flops = check_positive_float("max_total_flops", max_total_flops)
    if samples is not None and validation_only:
        raise ValueError(f"samples: {samples!r} given with validation_only; a validation-only comparison runs no "
                         f"bootstrap on a test set, so leave --bootstrap-samples out.")
    samples = check_int("samples", 1000 if samples is None else samples, 1)
    if isinstance(run_dirs, (str, bytes)):
        raise ValueError(f"runs: {run_dirs!r} is one path; give a list of run directories (the reference first).")
    run_dirs = list(run_dirs)
    if len(run_dirs) < 2:
        raise ValueError(f"runs: {len(run_dirs)} given; compare at least two run directories (the reference first).")
    names = list(names) if names is not None else [Path(d).name for d in run_dirs]
    if len(names) != len(run_dirs) or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"names: {names!r} must give one name per run ({len(run_dirs)} runs); runs that share a "
                         f"name are seeds of one arm.")
    for name in names:
        if not name.isprintable():
            raise ValueError(f"names: {name!r} holds a line break or control character; a run's name is one line "
                             f"of the tables (give --names, or names=, for runs whose directories have such names).")
    loaded = [load_run(d) for d in run_dirs]
    check_distinct_runs(run_dirs, loaded)
    output = Path(output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ValueError(f"output: {str(output)!r} already exists and is not empty; choose a new directory.")
    if validation_only:
        from prunetrain.mt.comparison.compare_validation import validation_comparison, validation_markdown

        comparison, runs = validation_comparison(names, loaded, max_total_flops), None
        markdown = validation_markdown(comparison)
    else:
        from prunetrain.mt.comparison.time_to_quality import arms_time_to_quality, time_to_quality_section

        arms = compare_arms(names, loaded, run_dirs, samples=samples, max_total_flops=max_total_flops)
        runs = dict(zip(run_labels(names, loaded), loaded))
        comparison = dict(compare_runs(runs), **arms, time_to_quality=arms_time_to_quality(names, loaded))
        markdown = (comparison_markdown(comparison) + "\n![BLEU over training time](compare.png)\n"
                    + time_to_quality_section(comparison["time_to_quality"]))
    with staging_directory(output) as staging:  # built beside it and renamed in whole: a failure leaves nothing
        built = staging / "out"
        built.mkdir()
        if runs is not None:  # the figure plots test BLEU: not for a validation-only comparison
            first, *others = runs
            figure = training_figure(built, dict(runs[first], trained_name=_plot_label(first)),
                                     {_plot_label(n): runs[n] for n in others})
            if figure:
                (built / figure).replace(built / "compare.png")
                (built / "figures").rmdir()
        if runs is not None and comparison.get("time_to_quality"):
            from prunetrain.mt.comparison.time_to_quality import FIGURE, time_to_quality_figure

            time_to_quality_figure(comparison["time_to_quality"], built / FIGURE)
        (built / "compare.json").write_text(json.dumps(comparison, indent=1))
        (built / "compare.md").write_text(markdown)
        replace_directory(built, output, kind="comparison")
    return comparison


__all__ = ["bleu_at_time", "check_distinct_runs", "compare_runs", "comparison_markdown", "load_run", "write_comparison"]
