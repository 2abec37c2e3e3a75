"""Ray Data's face: `EmbedBatches`, a callable class for `Dataset.map_batches` that holds one
Embedder per actor, on the devices Ray gave it, and adds each batch's vectors as a column."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from embedx.config import Settings
from embedx.embedder import Embedder
from embedx.errors import InvalidInput


class EmbedBatches:
    """Embed a dataset's text column on a pool of Ray actors, one model each (docs/ray.md):

        ds.map_batches(
            EmbedBatches,
            fn_constructor_kwargs={"model": "sentence-transformers/all-MiniLM-L6-v2"},
            batch_format="pyarrow", batch_size=1024, concurrency=4, num_gpus=1,
        )

    Each actor loads the model once, on every device it sees: the GPU that `num_gpus=1` made
    its CUDA_VISIBLE_DEVICES, or the CPU where there is none (`devices="cpu"` keeps a CPU
    actor off a GPU host's cards). A batch keeps its columns and gains `output_column`, its
    rows' vectors in their order: a fixed-size list of float32 in a `pyarrow` batch (as the
    corpus job writes to Parquet), an (N, D) float32 array in a `numpy` one.
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        pooling: str | None = None,
        text_column: str = "text",
        output_column: str = "embedding",
        input_type: str | None = None,
        instruction: str | None = None,
        dimensions: int | None = None,
        normalize: bool | None = None,
        dtype: str | None = None,
        max_seq_len: int | None = None,
        settings: Settings | None = None,
        **overrides: Any,
    ) -> None:
        self.text_column = text_column
        self.output_column = output_column
        self._options: dict[str, Any] = {
            "input_type": input_type,
            "instruction": instruction,
            "dimensions": dimensions,
            "normalize": normalize,
        }
        self.embedder = Embedder(
            model,
            pooling=pooling,
            dtype=dtype,
            max_seq_len=max_seq_len,
            settings=settings,
            **overrides,
        )
        self.width = dimensions or self.embedder.dimensions

    def __call__(self, batch: Any) -> Any:
        """`batch` with its vectors added: a pyarrow Table, or a dict of numpy arrays."""
        import pyarrow as pa

        if isinstance(batch, pa.Table):
            self._check_column(batch.column_names)
            vectors = self._embed(batch.column(self.text_column).to_pylist())
            flat = pa.array(vectors.reshape(-1), pa.float32())
            column = pa.FixedSizeListArray.from_arrays(flat, self.width)
            return batch.append_column(self.output_column, column)
        if isinstance(batch, dict):
            self._check_column(list(batch))
            return {**batch, self.output_column: self._embed(batch[self.text_column].tolist())}
        raise TypeError(
            f"EmbedBatches takes pyarrow or numpy batches, got a {type(batch).__name__}: "
            "map_batches(EmbedBatches, batch_format='pyarrow', ...)"
        )

    def _check_column(self, columns: list[str]) -> None:
        if self.text_column not in columns:
            raise InvalidInput(
                f"the batch has no column {self.text_column!r} (it has {', '.join(columns)}): "
                "EmbedBatches(text_column=...) names the texts' column",
                param="text_column",
            )

    def _embed(self, texts: list[Any]) -> np.ndarray:
        if not texts:  # an empty block's batch: the engine refuses an empty input
            return np.zeros((0, self.width), np.float32)
        return self.embedder.embed(texts, **self._options)

    def close(self) -> None:
        """Unload the model (an actor's process exits with it anyway)."""
        self.embedder.close()
