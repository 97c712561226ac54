"""Running a recipe: the runner, its run directory and records, preflight checks, the run settings, the starting
model, the Trainer set-up every recipe shares, the gate sweeps and the report."""
