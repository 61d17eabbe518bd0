"""Naming and placement: the rules, torch -> Flax placement, Flax -> torch naming,
the target tree.
"""
