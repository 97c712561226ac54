"""Recipe configs validated at load: the main recipe (`recipe`), the gate sweep (`recipe_l0`), FLOP budgets
(`recipe_budget`) and the YAML reading and `--set` overrides (`recipe_yaml`)."""
