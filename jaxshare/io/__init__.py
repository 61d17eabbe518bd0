"""The I/O engine under every conversion: sources, plans, read-ahead, mapped and direct
reads, atomic outputs and the files they write, buffers, prefetch and threads.

Numpy only. Its public names are faced by ``jaxshare.stream`` (the pipeline) and
``jaxshare.internal`` (the plumbing the upper layers share); the formats and the
checkpoints import its modules directly.
"""
