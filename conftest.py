"""Test-wide settings, loaded before any test module or doctest imports JAX."""

import os

# Sharded code paths run on 8 fake CPU devices everywhere, CI included.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# The tests are bound by XLA's compile time, not by run time: without the backend's
# (LLVM's) optimisations the suite compiles about three times faster.
if "--xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from hypothesis import settings  # noqa: E402

settings.register_profile("ci", deadline=None, max_examples=60, print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=20)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
