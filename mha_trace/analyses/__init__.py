"""Each analysis takes a Run or a model and returns a record: heads, walks, ablation, shapes, verify, surveys, pruning."""
