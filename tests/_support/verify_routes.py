"""``assert_verified``: a conversion's output holds its input bit for bit (``bridge.verify``).

Route tests call it after a conversion: the two sides compared through the naming
records, and the output alone against its manifest where it was written with one.
Loaded by the ``load_script`` fixture (test modules never import helper modules).
"""

from __future__ import annotations

import os
from typing import Any

import bridge


def assert_verified(
    a: str | os.PathLike, b: str | os.PathLike | None = None, **options: Any
) -> bridge.VerifyReport:
    """``bridge.verify(a, b, **options)``, which must find no difference; the report."""
    report = bridge.verify(a, b, **options)
    assert report.ok, "\n".join(report.lines())
    return report
