"""Sample order: a function of (seed, epoch) only; disjoint across ranks; resumable mid-epoch."""

import pytest

from drivebench.data.sampling import RandomBatchSampler


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


def test_skip_next_resumes_mid_epoch_once():
    s = RandomBatchSampler(40, 4, seed=3)
    full = list(s)
    s.skip_next(6)
    assert list(s) == full[6:]
    assert list(s) == full  # the skip applies to one iteration only


def test_lightning_sets_epoch_through_the_sampler_proxy():
    s = RandomBatchSampler(40, 4, seed=3)
    s.sampler.set_epoch(5)
    assert s.epoch == 5


def test_bad_rank_is_refused():
    with pytest.raises(ValueError, match="rank 2"):
        RandomBatchSampler(10, 2, num_replicas=2, rank=2)
