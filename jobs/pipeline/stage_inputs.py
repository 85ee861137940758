"""The columns a Ray Data stage reads, declared by the stage and checked once per batch.

Each stage of the chain (validate, admit, generate, the sink, and the map stages of
continuation and --check-context) names the columns it needs, each with what it uses it
for, as Ray's LLM batch stages do (``get_required_input_keys``). A batch without one
fails at the stage's door with one line naming the stage and every missing column,
instead of a KeyError deep inside a row's handling (or a row written without it). The
check looks at the batch's schema only: it costs nothing per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import pyarrow as pa


class MissingColumn(ValueError):
    """A batch reached a stage without a column the stage reads."""


@dataclass(frozen=True)
class StageInputs:
    """The columns ``stage`` reads: column name -> what the stage uses it for."""

    stage: str
    columns: Mapping[str, str]

    def missing(self, batch: pa.Table) -> list[str]:
        have = set(batch.column_names)
        return [name for name in self.columns if name not in have]

    def check(self, batch: pa.Table) -> None:
        """Raise MissingColumn naming every declared column the batch lacks. A batch
        of no rows reads nothing, so it passes whatever its columns."""
        missing = self.missing(batch) if batch.num_rows else []
        if missing:
            what = "; ".join(f"{name!r} ({self.columns[name]})" for name in missing)
            raise MissingColumn(
                f"{self.stage}: input batch has no column {what}; it has "
                f"{', '.join(batch.column_names) or 'none'}")

    def __or__(self, more: Mapping[str, str]) -> "StageInputs":
        return StageInputs(self.stage, {**self.columns, **more})
