"""Display tables for notebooks: the data keep full precision, these give each row a unit and a fitting format.

:func:`diff_summary_table` shows :meth:`tessera_lab.report.capacity.DiffReport.summary_rows` with shares (MFU,
bubble fraction, EP comm hidden: unit ``""`` in the data) as percentages and tokens/s as whole numbers.
"""

from __future__ import annotations

from typing import Any

from tessera_lab.report.formatting import DECIMALS, diff_summary_rows, format_value  # noqa: F401


def diff_summary_table(diff: Any):
    """pandas DataFrame of :func:`diff_summary_rows` for a :class:`~tessera_lab.report.capacity.DiffReport`,
    indexed by metric."""
    import pandas as pd

    return pd.DataFrame(diff_summary_rows(diff.summary_rows(), diff.labels)).set_index("metric")


__all__ = ["DECIMALS", "format_value", "diff_summary_rows", "diff_summary_table"]
