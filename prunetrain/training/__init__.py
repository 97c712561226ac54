"""Trainer integration: callbacks that decide *when* to score, mask, gate or shrink heads during HF `Trainer` training,
calling the methods that decide *what*, plus the state they keep across checkpoints."""
