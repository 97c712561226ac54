"""Comparing runs: arms at equal FLOPs and bootstrap (`compare_arms`), seeds and test sets (`compare_seeds`), the
validation-only choice (`compare_validation`) and the command's entry (`compare`)."""
