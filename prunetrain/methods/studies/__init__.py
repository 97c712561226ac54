"""The studies of Michel et al. (2019), each a library function that returns JSON-able results and writes figures.

1. `ablate_each_head`         §3.2 Table 1 / Fig. 1: the metric with each head alone removed, as a change Δ from
                              the full model; how many heads change it by more than `threshold`, how many
                              significantly (`PairedTest`), how many improve it.               (`ablation`)
2. `keep_one_head_per_layer`  §3.3 Table 2: for each site (layer × kind), all heads but the best one removed.
                                                                                               (`one_head`)
3. `cross_dataset`            §3.4 Fig. 2: the ablation Δ of every head on two datasets, Pearson and Spearman.
                                                                                               (`two_datasets`)
4. `pruning_curves_study`     §4.2 Fig. 3: metric vs % heads pruned, importance order (re-estimated after every
                              step) against random order (mean and spread over seeds); the largest fraction whose
                              metric stays within `threshold` of the full model.               (`curves`)
5. `per_kind_curves`          §5 Fig. 4: the same, pruning only one attention kind at a time. (`per_kind`)
6. `speed_study`              §4.3: the benchmark (`prunetrain.bench.benchmark`) of the shrunk model at each
                              fraction.                                                        (`speed`)

Shared by them: `journal` (the resumable record of units), `evaluation` (the metric without gradients),
`paired_test` (the significance plumbing), `outputs` (figures and TensorBoard), `tables` (Markdown tables) and
`correlation` (Pearson, Spearman).

`metric(model) -> float | dict` is any callable (see `prunetrain.methods.curve`: `loss_metric`, `accuracy_metric`,
or `prunetrain.mt.evaluation.metrics.bleu_metric`); with a dict, `key` names the value to use. Higher is better unless
`higher_is_better=False` (a loss). A metric whose dict holds per-sentence statistics (`sentence_stats`) and that
carries `score_from_stats` (`bleu_metric(..., sentence_stats=True)`) gets every change of studies 1–3 tested by a
paired bootstrap (`prunetrain.methods.significance`), as the paper marks significance at p < 0.01.

Every study with an `out_dir` writes `<out_dir>/<name>.json`, PNG figures and TensorBoard events
(`<out_dir>/tensorboard`), shows a progress bar (`prunetrain.utils.progress`), and is **resumable**: each unit of
work (one masked evaluation, one curve point, one benchmark) is saved to `<name>.partial.json` as soon as it is
done; calling the study again with the same arguments skips the saved units and returns the same result (with a
finished `<name>.json` it returns that file's result without any work). Other arguments are refused (ValueError
naming them) rather than mixed with the saved units.
"""

from prunetrain.methods.studies.ablation import ablate_each_head
from prunetrain.methods.studies.correlation import defined, pearson, spearman
from prunetrain.methods.studies.curves import pruning_curves_study, within
from prunetrain.methods.studies.evaluation import Metric
from prunetrain.methods.studies.journal import AfterUnit, Journal
from prunetrain.methods.studies.one_head import keep_one_head_per_layer
from prunetrain.methods.studies.outputs import KIND_COLORS
from prunetrain.methods.studies.paired_test import PairedTest
from prunetrain.methods.studies.per_kind import per_kind_curves
from prunetrain.methods.studies.speed import PAPER_SPEEDUP_AT_HALF, speed_study
from prunetrain.methods.studies.tables import ablation_table
from prunetrain.methods.studies.two_datasets import cross_dataset, write_cross_dataset_outputs

__all__ = ["Journal", "PAPER_SPEEDUP_AT_HALF", "ablate_each_head", "ablation_table", "cross_dataset", "defined",
           "keep_one_head_per_layer",
           "pearson", "per_kind_curves", "pruning_curves_study", "speed_study", "spearman", "within"]
