"""Sample order: a function of (seed, epoch) only; disjoint across ranks; resumable mid-epoch."""

import pytest

from drivebench.data.sampling import ContinuousBatches, RandomBatchSampler, SampleKey


def test_same_seed_same_order_and_new_order_per_epoch():
    a, b = RandomBatchSampler(40, 4, seed=7), RandomBatchSampler(40, 4, seed=7)
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first and sorted(sum(list(a), [])) == list(range(40))


def test_ranks_are_disjoint_and_equal_length():
    r0 = RandomBatchSampler(42, 4, num_replicas=2, rank=0, seed=1)
    r1 = RandomBatchSampler(42, 4, num_replicas=2, rank=1, seed=1)
    s0, s1 = set(sum(list(r0), [])), set(sum(list(r1), []))
    assert not s0 & s1 and len(r0) == len(r1) == 5


def test_continuous_batches_start_mid_epoch_and_run_on_or_stop():
    s = RandomBatchSampler(40, 4, seed=3)
    full = list(s)
    s.set_epoch(1)
    second = list(s)
    assert list(ContinuousBatches(s, start=(0, 6), keyed=False, epochs=1)) == full[6:]  # a resume
    assert list(ContinuousBatches(s, start=(0, 6), keyed=False, epochs=2)) == full[6:] + second
    keyed = next(iter(ContinuousBatches(s, start=(1, 0))))
    assert keyed == [SampleKey(i, 1) for i in second[0]]


def test_lightning_sets_epoch_through_the_sampler_proxy():
    s = RandomBatchSampler(40, 4, seed=3)
    s.sampler.set_epoch(5)
    assert s.epoch == 5


def test_bad_rank_is_refused():
    with pytest.raises(ValueError, match="rank 2"):
        RandomBatchSampler(10, 2, num_replicas=2, rank=2)
