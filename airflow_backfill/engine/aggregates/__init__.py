"""Grouped aggregates: the hidden per-group state, its rounds and snapshot, and the MV rows it gives."""
