"""Benchmarks: A/B timing of a full vs a pruned model (interleaved rounds), FLOP-ideal speed-ups, memory, op breakdowns.

`prunetrain.bench.runner` holds the timing machinery and `benchmark` (options in `BenchConfig`);
`prunetrain.bench.flops` counts matmul FLOPs.
"""

from prunetrain.bench.flops import count_flops
from prunetrain.bench.runner import (Alternation, BenchConfig, BenchResult, alternate, benchmark, breakdown_table,
                                     compare_times, format_table, load_model, make_inputs, op_breakdown, peak_memory,
                                     run_bench, summarize)

__all__ = ["Alternation", "BenchConfig", "BenchResult", "alternate", "benchmark", "breakdown_table", "compare_times",
           "count_flops", "format_table", "load_model", "make_inputs", "op_breakdown", "peak_memory", "run_bench",
           "summarize"]
