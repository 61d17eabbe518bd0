"""The core: paths, alias maps and naming records, finding ties, dedupe and retie, Tied,
permutations, dtypes, strict JSON, manifests, ties by memory, reports, errors.

JAX (and flax, for NNX graphs) where a tree holds arrays; numpy otherwise. The tie API is
faced by ``jaxshare``; the rest by ``jaxshare.internal`` and ``jaxshare.stream``.
"""
