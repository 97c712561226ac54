"""The methods, built on the engine: head importance scorers (Michel et al. 2019, `importance`), which heads to remove
(`selection`), pruned-model curves (`curve`), Hard-Concrete L0 gates (Voita et al. 2019, `gates`), Michel et al.'s
studies (`studies`) and their paired bootstrap significance test (`significance`). None of them needs a Trainer."""
