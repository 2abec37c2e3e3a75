from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from embedx.scheduling import Cut, End, Generations, Item, Job, LengthBuckets


def buckets_of(lengths: list[int], job: Job | None = None) -> tuple[LengthBuckets, Job]:
    job = job or Job(len(lengths))
    buckets = LengthBuckets()
    buckets.push_all(Item(job, i, n) for i, n in enumerate(lengths))
    return buckets, job


def test_long_end_takes_budget_over_longest_items() -> None:
    buckets, _ = buckets_of([10, 50, 40, 50, 30, 20])
    cut = Cut(area_budget=120, token_target=120)
    buckets.cut(End.LONG, cut)
    assert [i.length for i in cut.items] == [50, 50]  # 120 // 50 = 2
    assert cut.longest == 50


def test_short_end_takes_items_while_count_plus_one_times_longest_fits() -> None:
    buckets, _ = buckets_of([10, 50, 40, 50, 30, 20])
    cut = Cut(area_budget=90, token_target=90)
    buckets.cut(End.SHORT, cut)
    # 10 -> 2*20=40 ok -> 3*30=90 ok -> 4*40=160 stop
    assert [i.length for i in cut.items] == [10, 20, 30]


def test_an_item_longer_than_the_budget_is_a_batch_of_one() -> None:
    buckets, _ = buckets_of([500, 5])
    cut = Cut(area_budget=100, token_target=100)
    buckets.cut(End.LONG, cut)
    assert [i.length for i in cut.items] == [500]


def test_equal_lengths_leave_in_arrival_order() -> None:
    buckets, _ = buckets_of([7, 7, 7, 7])
    cut = Cut(area_budget=14, token_target=14)
    buckets.cut(End.SHORT, cut)
    assert [i.index for i in cut.items] == [0, 1]


def test_cut_drops_items_of_cancelled_jobs() -> None:
    live = Job(2)
    gone = Job(2)
    gone.cancelled = True
    buckets = LengthBuckets()
    for job in (gone, live):
        buckets.push_all([Item(job, 0, 10), Item(job, 1, 10)])
    cut = Cut(area_budget=1000, token_target=1000)
    buckets.cut(End.LONG, cut)
    assert all(item.job is live for item in cut.items)
    assert buckets.count == 0


def test_a_cut_fills_its_room_past_cancelled_items_and_leaves_the_rest_in_order() -> None:
    live, gone = Job(4), Job(4)
    gone.cancelled = True
    buckets = LengthBuckets()
    for i in range(4):  # gone, live, gone, live, ... all of one length
        buckets.push_all([Item(gone, i, 10), Item(live, i, 10)])
    cut = Cut(area_budget=30, token_target=30)  # room for three
    buckets.cut(End.LONG, cut)
    assert [(item.job is live, item.index) for item in cut.items] == [
        (True, 0),
        (True, 1),
        (True, 2),
    ]
    assert cut.tokens == 30
    assert cut.longest == 10
    assert buckets.count == 2  # what the cut did not reach: gone 3, live 3
    assert [(item.job is live, item.index) for item in buckets.items()] == [(False, 3), (True, 3)]


def test_max_items_caps_a_batch() -> None:
    buckets, _ = buckets_of([3] * 10)
    cut = Cut(area_budget=1000, token_target=1000, max_items=4)
    buckets.cut(End.SHORT, cut)
    assert len(cut.items) == 4


def test_token_target_bounds_real_tokens() -> None:
    buckets, _ = buckets_of([10] * 10)
    cut = Cut(area_budget=1000, token_target=35)
    buckets.cut(End.LONG, cut)
    assert cut.tokens == 30


@given(
    lengths=st.lists(st.integers(1, 600), min_size=1, max_size=300),
    budget=st.integers(1, 5000),
    end=st.sampled_from(End),
)
def test_cuts_partition_the_items_and_respect_the_budget(
    lengths: list[int], budget: int, end: End
) -> None:
    buckets, _ = buckets_of(lengths)
    seen: list[int] = []
    while buckets.count:
        cut = Cut(area_budget=budget, token_target=budget)
        buckets.cut(end, cut)
        assert cut.items, "a cut of a non-empty structure takes at least one item"
        assert len(cut.items) == 1 or cut.area <= budget
        ordered = [i.length for i in cut.items]
        assert ordered == sorted(ordered, reverse=end is End.LONG)
        seen.extend(i.index for i in cut.items)
    assert sorted(seen) == list(range(len(lengths)))


def test_a_cut_serves_the_oldest_generation_first_and_newcomers_join_the_next() -> None:
    pending, job = Generations(), Job(6)
    pending.add([Item(job, i, 50) for i in range(3)], now=0.0)
    first = Cut(area_budget=100, token_target=100)
    pending.cut(End.SHORT, first)  # seals the first generation
    pending.add([Item(job, 3 + i, 5) for i in range(3)], now=1.0)  # short: the SHORT end's
    assert pending.first_length(End.SHORT) == 50
    rest = Cut(area_budget=1000, token_target=1000)
    pending.cut(End.SHORT, rest)
    assert [i.index for i in first.items] == [0, 1]
    assert [i.index for i in rest.items] == [2, 3, 4, 5]
    assert [i.generation for i in rest.items] == [0, 1, 1, 1]
