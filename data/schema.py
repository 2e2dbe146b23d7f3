"""The parquet layout and a deterministic writer for it.

One fixed Arrow schema for every file this package writes, so that train, test and validation files (and
files from different runs) can be listed together in ``data.train_files`` / ``data.val_files``: verl
concatenates them with ``datasets.concatenate_datasets``, which needs identical features. The writer uses fixed
options and fixed row-group boundaries and Arrow writes no timestamps, so the same rows give the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from r1_ascend.atomic import atomic_path

PROMPT_MESSAGE = pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string())])

EXTRA_INFO = pa.struct(
    [
        pa.field("index", pa.int64()),  # position in the concatenated inputs (unique within one output file)
        pa.field("split", pa.string()),  # "train" / "test"
        pa.field("input_file", pa.string()),  # base name of the source file
        pa.field("input_row", pa.int64()),  # 0-based row number within that file
        pa.field("problem", pa.string()),  # the problem text as given (the prompt holds the stripped text)
        pa.field("solution", pa.string()),  # reference solution when the source has one, else null
        pa.field("extra_fields", pa.string()),  # JSON object text of the source row's other fields
    ]
)

SCHEMA = pa.schema(
    [
        pa.field("data_source", pa.string()),
        pa.field("prompt", pa.list_(PROMPT_MESSAGE)),
        pa.field("ability", pa.string()),
        pa.field("reward_model", pa.struct([pa.field("style", pa.string()), pa.field("ground_truth", pa.string())])),
        pa.field("extra_info", EXTRA_INFO),
    ]
)

ROW_GROUP_SIZE = 4096
# Fixed writer options: changing any of them changes the bytes (but not the content) of every file.
WRITER_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 3,
    "use_dictionary": True,
    "write_statistics": True,
    "version": "2.6",
    "data_page_version": "1.0",
}


def write_parquet(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    """Write ``rows`` to ``path`` atomically (temp file + rename) in fixed-size row groups; return the row count."""
    count = 0
    with atomic_path(path) as tmp, pq.ParquetWriter(tmp, SCHEMA, **WRITER_OPTIONS) as writer:
        for batch in _batches(rows, ROW_GROUP_SIZE):
            writer.write_table(pa.Table.from_pylist(batch, schema=SCHEMA), row_group_size=ROW_GROUP_SIZE)
            count += len(batch)
        if count == 0:
            writer.write_table(SCHEMA.empty_table())
    return count


def _batches(rows: Iterable[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
