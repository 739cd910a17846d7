"""Periodic dims: patches across a global grid's seam, blended back onto their cells."""
