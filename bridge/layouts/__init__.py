"""Layouts: the naming and placement convention of a model family (jaxshare,
transformers-flax, MaxText, Tunix), a layout as a table of entries and ops (its
engine: sizes, ops, table, view), and a Flax-named source placed anew in one.
"""
