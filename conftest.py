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


def skipped_lines(reports: list) -> list[str]:
    """One line per reason the ``reports`` (skipped tests and modules) were skipped for:
    how many, why, and the first of them."""
    by_reason: dict[str, list[str]] = {}
    for report in reports:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple | list) else str(longrepr)
        by_reason.setdefault(reason.removeprefix("Skipped: "), []).append(report.nodeid)
    return [
        f"{len(ids)} skipped: {reason} (first: {ids[0]})"
        for reason, ids in sorted(by_reason.items(), key=lambda item: item[1][0])
    ]


def pytest_terminal_summary(terminalreporter) -> None:
    """Every run ends with what it did not test, and why: a skip (a feature this machine
    lacks, a module not installed, an opt-in) is reported, never silent."""
    lines = skipped_lines(terminalreporter.stats.get("skipped", []))
    if lines:
        terminalreporter.write_sep("=", "not tested in this run")
        for line in lines:
            terminalreporter.write_line(line)
