"""A torchmetrics ``Metric`` whose state is what each validation sample contributed, as arrays.

Why: the detection, map and motion metrics (AP over confidence-ranked predictions, greedy matching
per sample) need every prediction of the epoch, not a running sum, and under DDP every rank's.
torchmetrics gathers list states that hold tensors (``dist_reduce_fx="cat"``) over all ranks when
``compute()`` runs, so this class keeps each per-sample field as flat tensors plus the sample's
row counts, and gives the samples back to ``compute`` as the numpy arrays the metric's maths was
written for. The order is rank 0's samples, then rank 1's, ... (torchmetrics gathers in rank
order), each rank's in update order.

States are created on the metric's device (the LightningModule moves its metrics with it), so the
gather works under NCCL too, and are not ``persistent``: checkpoints do not carry validation
accumulators, and a module's ``state_dict`` keys stay as they were before metrics were
``Metric`` s.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat


def _cat(state: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A cat state as one tensor: a list before a DDP sync (possibly empty), a tensor after it."""
    if isinstance(state, torch.Tensor):
        values = state
    elif not state:
        values = torch.zeros(0, dtype=dtype or torch.float32)
    else:
        values = dim_zero_cat(state)
    return values.to(dtype) if dtype is not None else values


class SampleRecords(Metric):
    """Keeps named per-sample arrays (any leading length, fixed trailing shape) as ``cat`` states.

    Args:
        fields: field name -> number of dimensions of the array each sample gives (1: a vector of
            one value per row, 2: rows of a fixed width, ...).
        bool_fields: fields holding booleans (stored as uint8: collectives do not all take bool).
        kwargs: torchmetrics ``Metric`` options.

    Subclasses call :meth:`append_sample` from ``update`` and read :meth:`samples` or
    :meth:`concatenated` in ``compute``.
    """

    full_state_update = False  # each update only adds: torchmetrics may merge states (merge_state)

    def __init__(self, fields: Mapping[str, int], bool_fields: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fields = dict(fields)
        self.bool_fields = tuple(bool_fields)
        trailing = sum(ndim - 1 for ndim in self.fields.values())
        for name in self.fields:
            self.add_state(name, default=[], dist_reduce_fx="cat", persistent=False)
        # one row per sample: the leading length of every field
        self.add_state("sample_rows", default=[], dist_reduce_fx="cat", persistent=False)
        # the trailing shape of every field (the same on every rank; max is the reduction that keeps it)
        self.add_state("trailing_shape", default=torch.zeros(trailing, dtype=torch.long), dist_reduce_fx="max",
                       persistent=False)

    def append_sample(self, **arrays: np.ndarray) -> None:
        """One sample's arrays, one per field (numpy or tensors; copied to the metric's device)."""
        if set(arrays) != set(self.fields):
            raise ValueError(f"{type(self).__name__}: a sample needs the fields {sorted(self.fields)}, "
                             f"got {sorted(arrays)}")
        rows, trailing = [], []
        for name, ndim in self.fields.items():
            value = np.asarray(arrays[name])
            if value.ndim != ndim:
                raise ValueError(f"{type(self).__name__}: field {name!r} needs {ndim} dimensions, got shape "
                                 f"{value.shape}")
            if name in self.bool_fields:
                value = value.astype(np.uint8)
            rows.append(value.shape[0])
            trailing.extend(value.shape[1:])
            getattr(self, name).append(torch.as_tensor(np.ascontiguousarray(value).reshape(-1), device=self.device))
        self.sample_rows.append(torch.tensor(rows, dtype=torch.long, device=self.device))
        if trailing:
            self.trailing_shape = torch.maximum(self.trailing_shape,
                                                torch.tensor(trailing, dtype=torch.long, device=self.device))

    def _trailing(self) -> dict[str, tuple[int, ...]]:
        dims = self.trailing_shape.tolist()
        out, at = {}, 0
        for name, ndim in self.fields.items():
            out[name] = tuple(int(d) for d in dims[at:at + ndim - 1])
            at += ndim - 1
        return out

    def _rows(self) -> np.ndarray:
        """(samples, fields) leading lengths."""
        return _cat(self.sample_rows, torch.long).cpu().numpy().reshape(-1, len(self.fields))

    def concatenated(self, name: str) -> np.ndarray:
        """Every sample's rows of field ``name``, in sample order, as one array."""
        values = _cat(getattr(self, name)).cpu().numpy()
        trailing = self._trailing()[name]
        array = values.reshape(-1, *trailing) if values.size else values.reshape(0, *trailing)
        return array.astype(bool) if name in self.bool_fields else array

    @property
    def num_samples(self) -> int:
        return int(self._rows().shape[0])

    def samples(self) -> list[dict[str, np.ndarray]]:
        """Every sample's arrays (after a DDP sync: every rank's samples, rank by rank)."""
        rows = self._rows()
        out: list[dict[str, np.ndarray]] = [{} for _ in range(len(rows))]
        for column, name in enumerate(self.fields):
            array = self.concatenated(name)
            starts = np.concatenate([[0], np.cumsum(rows[:, column])])
            for i in range(len(rows)):
                out[i][name] = array[starts[i]:starts[i + 1]]
        return out
