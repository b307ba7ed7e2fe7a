"""The lecture's mechanisms, with no tool concepts: attention, masks, RoPE, the tracers, the chapter's cost formulas, sizes and devices."""
