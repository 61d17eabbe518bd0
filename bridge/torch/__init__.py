"""The homes that touch torch tensors and modules: each imported only when torch
objects are given or asked for.
"""
