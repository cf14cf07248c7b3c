"""SequenceGroupedBatchSampler: streams of whole sequences per slot, DDP split, determinism."""

from __future__ import annotations

import random

import pytest

from drivebench.data.sampling import ContinuousBatches
from drivebench.data.streaming import SequenceGroupedBatchSampler, prev_exists_for


def _dataset(num_seq: int = 11, seed: int = 3) -> tuple[list[int], list[int]]:
    """Sequences of uneven length, stored in a shuffled dataset order."""
    rng = random.Random(seed)
    rows = [(s, f) for s in range(num_seq) for f in range(rng.randint(3, 9))]
    rng.shuffle(rows)
    return [r[0] for r in rows], [r[1] for r in rows]


def _check_slots_walk_sequences(batches: list[list[int]], seq: list[int], frame: list[int]) -> None:
    for slot in range(len(batches[0])):
        column = [b[slot] for b in batches]
        for prev, cur in zip(column, column[1:]):
            if seq[cur] == seq[prev]:
                assert frame[cur] == frame[prev] + 1, "a slot skipped or reordered frames of its sequence"
            else:
                assert frame[cur] == 0, "a slot entered a new sequence somewhere else than its first frame"
        assert frame[column[0]] == 0


def test_each_slot_walks_one_sequence_in_frame_order_and_epoch_covers_everything_without_drop_last() -> None:
    seq, frame = _dataset()
    sampler = SequenceGroupedBatchSampler(seq, frame, batch_size=3, shuffle=True, drop_last=False, seed=1)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    assert all(len(b) == 3 for b in batches)
    _check_slots_walk_sequences(batches, seq, frame)
    seen = {i for b in batches for i in b}
    assert seen == set(range(len(seq)))


def test_drop_last_covers_each_sample_at_most_once_and_cuts_only_stream_tails() -> None:
    seq, frame = _dataset()
    sampler = SequenceGroupedBatchSampler(seq, frame, batch_size=3, drop_last=True, seed=5)
    batches = list(sampler)
    flat = [i for b in batches for i in b]
    assert len(flat) == len(set(flat)), "a sample was yielded twice in one epoch"
    _check_slots_walk_sequences(batches, seq, frame)
    # balanced dealing: at most one sequence's worth of frames is skipped per slot
    longest = max(frame) + 1
    assert len(seq) - len(flat) <= 3 * longest


def test_two_ranks_get_disjoint_sequences_and_equal_lengths() -> None:
    seq, frame = _dataset(num_seq=13)
    for drop_last in (True, False):
        ranks = [SequenceGroupedBatchSampler(seq, frame, batch_size=2, num_replicas=2, rank=r, seed=7,
                                             drop_last=drop_last) for r in range(2)]
        for s in ranks:
            s.set_epoch(4)
        out = [list(s) for s in ranks]
        assert len(out[0]) == len(out[1]) == len(ranks[0]) == len(ranks[1])
        seqs = [{seq[i] for b in o for i in b} for o in out]
        assert not seqs[0] & seqs[1], "two ranks share a sequence"
        for o in out:
            _check_slots_walk_sequences(o, seq, frame)
        if not drop_last:
            assert {i for o in out for b in o for i in b} == set(range(len(seq)))


def test_order_is_deterministic_per_seed_and_epoch_and_changes_across_epochs() -> None:
    seq, frame = _dataset(num_seq=20)
    a = SequenceGroupedBatchSampler(seq, frame, batch_size=2, seed=11)
    b = SequenceGroupedBatchSampler(seq, frame, batch_size=2, seed=11)
    a.set_epoch(2)
    b.set_epoch(2)
    assert list(a) == list(b)
    b.set_epoch(3)
    assert list(a) != list(b)
    c = SequenceGroupedBatchSampler(seq, frame, batch_size=2, seed=12)
    c.set_epoch(2)
    assert list(a) != list(c)


def test_prev_exists_pairs_match_the_stream() -> None:
    seq, frame = _dataset()
    sampler = SequenceGroupedBatchSampler(seq, frame, batch_size=3, seed=2, yield_prev_exists=True)
    previous = None
    for step, batch in enumerate(sampler):
        idx = [i for i, _ in batch]
        flags = [f for _, f in batch]
        assert flags == prev_exists_for(idx, previous, seq, frame)
        for i, flag in zip(idx, flags):
            assert flag == (step > 0 and frame[i] > 0)
        previous = idx


def test_prev_exists_for_hand_cases() -> None:
    seq = [0, 0, 0, 1, 1]
    frame = [0, 1, 2, 0, 1]
    assert prev_exists_for([1, 4], None, seq, frame) == [False, False]
    assert prev_exists_for([1, 4], [0, 3], seq, frame) == [True, True]
    assert prev_exists_for([2, 3], [0, 4], seq, frame) == [False, False]  # gap of 2; new sequence
    assert prev_exists_for([2], [0], seq, frame, max_frame_gap=2) == [True]
    assert prev_exists_for([0], [1], seq, frame) == [False]  # backwards


def test_too_few_sequences_is_one_config_error_naming_the_key_and_the_fit() -> None:
    from drivebench.errors import ConfigError

    with pytest.raises(ConfigError, match=r"model.batch_size=2 x 2 rank\(s\) needs 4 driving sequences .* holds 2: "
                                          r"lower model.batch_size to 1"):
        SequenceGroupedBatchSampler([0, 0, 1], [0, 1, 0], batch_size=2, num_replicas=2)
    with pytest.raises(ConfigError, match=r"holds 1: use at most 1 rank"):
        SequenceGroupedBatchSampler([0, 0, 0], [0, 1, 2], batch_size=1, num_replicas=2)


def test_validation_fits_its_slots_to_fewer_sequences_and_still_walks_each_in_order() -> None:
    seq, frame = [0, 0, 0, 1, 1], [0, 1, 2, 0, 1]
    sampler = SequenceGroupedBatchSampler(seq, frame, batch_size=6, shuffle=False, drop_last=False, fit_streams=True)
    assert sampler.batch_size == 2
    batches = sampler.plan(0)
    # slot 0 walks sequence 0 in frame order, slot 1 sequence 1 (replayed to the longer stream): every sample seen
    assert batches == [[0, 3], [1, 4], [2, 3]]


def test_plugs_into_the_datamodule_epoch_and_resume_hooks() -> None:
    from drivebench.data.streaming import streaming_batch_sampler

    seq, frame = _dataset()

    class Frames:
        sequence_ids, frame_idx = seq, frame

    class Records:  # NuScenesDataset's shape: info dicts
        records = [{"sequence_id": s, "frame_idx": f} for s, f in zip(seq, frame)]

    sampler = streaming_batch_sampler(Frames(), batch_size=2, seed=4, yield_prev_exists=False)
    sampler.sampler.set_epoch(1)  # what Lightning calls
    full = list(sampler)
    assert list(ContinuousBatches(sampler, start=(1, 3), keyed=False, epochs=1)) == full[3:]  # resumed mid-epoch
    paired = streaming_batch_sampler(Records(), batch_size=2, seed=4)
    paired.set_epoch(1)
    assert [[i for i, _ in b] for b in paired] == full
    with pytest.raises(AttributeError, match="sequence_ids"):
        streaming_batch_sampler(object(), batch_size=2)
