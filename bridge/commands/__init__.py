"""The library commands: open, convert, inspect, check, verify, declared ties, to_flax."""
