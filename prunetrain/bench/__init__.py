"""Benchmarks: A/B timing of a full vs a pruned model (interleaved rounds), FLOP-ideal speed-ups, memory, op breakdowns.

By what they measure: `prunetrain.bench.timing` (the interleaved timing loop and its statistics),
`prunetrain.bench.cases` (inputs and the measured cases), `prunetrain.bench.profiling` (peak memory, op breakdowns),
`prunetrain.bench.flops` (matmul FLOPs), `prunetrain.bench.report` (FLOP-ideal columns, `BenchResult`, the table);
`prunetrain.bench.config` holds `BenchConfig` (its records `BenchWorkload`, `BenchCalls`, `BenchTiming`,
`BenchReport`) and `prunetrain.bench.runner` the entry points `benchmark` and
`run_bench`.
"""

from prunetrain.bench.cases import make_inputs
from prunetrain.bench.config import BenchCalls, BenchConfig, BenchReport, BenchTiming, BenchWorkload
from prunetrain.bench.flops import count_flops
from prunetrain.bench.profiling import breakdown_table, op_breakdown, peak_memory
from prunetrain.bench.report import BenchResult, format_table
from prunetrain.bench.runner import benchmark, load_model, run_bench
from prunetrain.bench.timing import Alternation, alternate, compare_times, summarize

__all__ = ["Alternation", "BenchCalls", "BenchConfig", "BenchReport", "BenchResult", "BenchTiming", "BenchWorkload",
           "alternate", "benchmark", "breakdown_table", "compare_times", "count_flops", "format_table", "load_model", "make_inputs", "op_breakdown", "peak_memory", "run_bench",
           "summarize"]
