"""Layouts: the naming and placement convention of a model family (jaxshare,
transformers-flax, MaxText), and a Flax-named source placed anew in one.
"""
