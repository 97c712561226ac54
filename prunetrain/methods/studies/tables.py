"""The studies' Markdown tables: Michel et al.'s Table 1 (`ablation_table`), the one-head-per-layer table
(Table 2) and the speed table (§4.3), each a pure function of a study's result rows."""

from __future__ import annotations

from typing import Mapping, Sequence

from prunetrain.methods.significance import significant


def p_text(p: float | None) -> str:
    """A p-value for a table cell ("—" where no test ran)."""
    return "—" if p is None else f"{p:.3f}"


def ablation_table(result: Mapping) -> str:
    """Michel Table 1 as Markdown from an `ablate_each_head` result: one grid per attention kind, a row per layer, a
    column per head, each cell the Δ of removing that head alone; cells beyond the result's threshold are bold, and
    with a significance test the significant ones (p < alpha) carry a dagger, as the paper marks them."""
    summary = result["summary"]
    threshold, test = summary["threshold"], summary.get("significance")
    marks = f"**bold**: |Δ| > {threshold:g}"
    if test:
        marks += (f"; †: significant, p < {test['alpha']:g} in a paired bootstrap test with {test['samples']} "
                  f"resamples — {summary['num_significant']} of {summary['num_heads']} heads")
    lines = [f"Base {result['metric']}: {result['base']:.2f}. Each cell: the change when that head alone is removed "
             f"({marks})."]
    rows = result["heads"]

    def cell(row) -> str:
        text = f"{row['delta']:+.2f}"
        text = f"**{text}**" if abs(row["delta"]) > threshold else text
        return text + "†" if test and significant(row.get("p_value"), test["alpha"]) else text

    for kind in dict.fromkeys(r["kind"] for r in rows):
        mine = [r for r in rows if r["kind"] == kind]
        heads = max(r["head"] for r in mine) + 1
        lines += ["", f"**{kind}**", "", "| layer | " + " | ".join(str(h) for h in range(heads)) + " |",
                  "|---|" + "---|" * heads]
        for layer in sorted(dict.fromkeys(r["layer"] for r in mine)):
            cells = {r["head"]: r for r in mine if r["layer"] == layer}
            lines.append(f"| {layer} | " + " | ".join(cell(cells[h]) if h in cells else "" for h in range(heads))
                         + " |")
    return "\n".join(lines) + "\n"


def one_head_table(rows: Sequence[Mapping], key: str, base: float, threshold: float) -> str:
    """Michel Table 2 as Markdown from a `keep_one_head_per_layer` result's rows: per site the head kept, the
    metric, its change, whether it stays within `threshold`, and the change's p-value."""
    lines = [f"| site | kind | layer | kept head | {key} | Δ | within {threshold:g} | p (paired bootstrap) |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['site']} | {r['kind']} | {r['layer']} | {r['kept_head']} | {r['value']:.2f} | "
              f"{r['delta']:+.2f} | {'yes' if r['survives'] else 'no'} | {p_text(r['p_value'])} |" for r in rows]
    return f"Base {key}: {base:.2f}\n\n" + "\n".join(lines) + "\n"


def speed_table(table: Sequence[Mapping], paper_speedup: float) -> str:
    """The speed study's Markdown table: per fraction and benchmark case the full and pruned times, the measured
    and the FLOP-ideal speed-up; then the paper's figure."""
    lines = ["| pruned | heads kept | task | batch×len | full ms | pruned ms | speed-up | FLOP-ideal |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {100 * t['fraction']:.0f} % | {t['heads_kept']} | {t['task']} | {t['batch']}×{t['seq_len']} | "
              f"{t['ms_full']:.2f} | {t['ms_pruned']:.2f} | {t['speedup']:.3f} | "
              f"{'n/a' if t['flop_ideal_speedup'] is None else format(t['flop_ideal_speedup'], '.3f')} |"
              for t in table]
    lines.append(f"\nPaper (Michel et al. §4.3, BERT): up to ×{paper_speedup} with 50 % of heads pruned.")
    return "\n".join(lines) + "\n"


__all__ = ["ablation_table", "one_head_table", "p_text", "speed_table"]
