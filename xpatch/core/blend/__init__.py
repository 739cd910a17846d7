"""Blending per-patch results back onto the grid: weighted overlap-add and its reductions."""
