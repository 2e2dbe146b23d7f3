"""Does a parquet file match what verl 0.6.1's RLHFDataset and reward manager read? (schema only, via pyarrow)"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def describe_problems(path: Path, keys: Mapping[str, str]) -> tuple[list[str], int]:
    """Problems with ``path`` (empty when usable) and its row count.

    ``keys``: ``prompt`` = data.prompt_key, ``reward_fn`` = data.reward_fn_key.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.is_file():
        return ["does not exist (r1-ascend prepare-data writes it)"], 0
    try:
        schema = pq.read_schema(path)
        rows = pq.read_metadata(path).num_rows
    except (OSError, pa.ArrowInvalid) as exc:
        return [f"is not a readable parquet file ({exc})"], 0
    problems = []
    fields = {f.name: f.type for f in schema}
    prompt_key, reward_key = keys["prompt"], keys["reward_fn"]
    prompt = fields.get(prompt_key)
    if prompt is None:
        problems.append(f"no column {prompt_key!r} (data.prompt_key)")
    elif not (pa.types.is_list(prompt) or pa.types.is_large_list(prompt)) or not _is_message(prompt.value_type):
        problems.append(f"column {prompt_key!r} is {prompt}, expected a chat list<struct<role, content>>")
    source = fields.get(reward_key)
    if source is None:
        problems.append(f"no column {reward_key!r} (data.reward_fn_key picks the reward function)")
    elif not pa.types.is_string(source) and not pa.types.is_large_string(source):
        problems.append(f"column {reward_key!r} is {source}, expected string")
    reward_model = fields.get("reward_model")
    if reward_model is None or not pa.types.is_struct(reward_model):
        problems.append("no struct column 'reward_model' with a 'ground_truth' field")
    elif reward_model.get_field_index("ground_truth") < 0:
        problems.append(f"reward_model is {reward_model}, which has no 'ground_truth' field")
    if rows == 0:
        problems.append("has no rows")
    return problems, rows


def _is_message(value_type: object) -> bool:
    import pyarrow as pa

    if not isinstance(value_type, pa.StructType):
        return False
    names = {value_type.field(i).name for i in range(value_type.num_fields)}
    return {"role", "content"} <= names
