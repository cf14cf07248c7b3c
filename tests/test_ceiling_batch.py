"""The ceiling's resident batch: of the first few loader batches, the one closest to training's median
size (batches of scenes vary in size and a step's compute follows it), and the note that says when a
heavier resident batch explains an efficiency above 100%."""

from __future__ import annotations

import torch

from drivebench.perf.bottleneck import efficiency_note, resident_batch_ratio
from drivebench.perf.callback import batch_elements
from drivebench.perf.ceiling import representative_batch


def _batch(agents: int) -> dict:
    return {"agent": {"position": torch.zeros(agents, 50, 2)}, "valid": [torch.ones(agents, dtype=torch.bool)]}


class Loader:
    """Yields batches of the given agent counts; records that it was closed (EpochStream.close stops its workers)."""

    def __init__(self, agents: list[int]) -> None:
        self.agents, self.closed, self.drawn = agents, False, 0

    def __iter__(self):
        for n in self.agents:
            self.drawn += 1
            yield _batch(n)

    def close(self) -> None:
        self.closed = True


def test_batch_elements_counts_every_tensor_of_a_nested_batch() -> None:
    assert batch_elements(_batch(3)) == 3 * 50 * 2 + 3
    assert batch_elements({"a": [1, "x"], "b": None}) == 0


def test_the_batch_closest_to_trainings_median_is_taken_from_the_first_five_and_the_loader_is_closed() -> None:
    loader = Loader([40, 10, 21, 35, 30, 20])
    batch, chosen = representative_batch(loader, target_elements=batch_elements(_batch(20)))
    assert batch["agent"]["position"].shape[0] == 21  # the 6th (exactly 20) is past the candidates
    assert chosen["candidates"] == 5 and loader.drawn == 5 and loader.closed
    assert chosen["candidates_elements"] == [batch_elements(_batch(n)) for n in (40, 10, 21, 35, 30)]
    # without a training phase (bench=ceiling): the candidates' median
    batch, chosen = representative_batch(Loader([40, 10, 21, 35, 30]), target_elements=None)
    assert batch["agent"]["position"].shape[0] == 30 and chosen["target_elements"] == batch_elements(_batch(30))


def _summary(train_elements: float, ceiling_elements: float) -> dict:
    def phase(elements, median):
        return {"steps_measured": 30, "samples_per_s": 4 / median, "batch_elements": {"median": elements},
                "step_s": {"median": median, "p10": median * 0.98, "p90": median * 1.02}}
    return {"efficiency": 1.2, "train": phase(train_elements, 1.0), "ceiling": phase(ceiling_elements, 1.2)}


def test_an_efficiency_above_100_percent_names_a_heavier_resident_batch() -> None:
    heavy = _summary(300_000, 375_000)
    assert resident_batch_ratio(heavy) == 1.25
    assert "1.25x the tensor elements of training's median batch" in efficiency_note(heavy)
    same = efficiency_note(_summary(300_000, 300_000))
    assert same is not None and "tensor elements" not in same  # another reason, stated with its numbers
