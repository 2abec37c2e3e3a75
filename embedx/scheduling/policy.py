"""Which work a device should claim: pure functions over a `QueueView`, the end game among them.

Fast devices take the LONG end of the length order and slow ones the SHORT end, so the two
frontiers meet wherever the devices' measured speeds put them; no ratio is configured. Near
the end of the work a claim is sized so that the device finishes no later than the others
would finish everything left without it; a device that cannot help sits out. Every function
here reads the view it is given and nothing else: the queue decides nothing by itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from embedx.scheduling.buckets import End
from embedx.scheduling.view import DeviceView, QueueView

# A host-CPU device beside accelerators works only if it could do this share of the work.
MIN_HOST_SHARE = 0.02


def ranked(view: QueueView) -> list[DeviceView]:
    """Active devices, fastest first by measured (or prior) tokens/s."""
    return sorted(view.devices, key=lambda d: -d.effective_rate())


def end_for(view: QueueView, me: DeviceView) -> End:
    """The faster half of the devices takes the LONG end, the rest the SHORT end.
    A device not yet measured takes the SHORT end: its first item should be cheap."""
    if not me.known:
        return End.SHORT
    order = ranked(view)
    return End.LONG if order.index(me) < len(order) / 2 else End.SHORT


def host_waits(view: QueueView, me: DeviceView) -> bool:
    """Whether a device computing on the host's CPU should stay idle so the host feeds the
    accelerators: the host tokenizes, and its one event-loop thread launches every batch.
    So it waits while texts are being tokenized, and sits out entirely when its best share
    of the work is below MIN_HOST_SHARE: its batches would cost the accelerators more (cores,
    and the interpreter lock its forward holds) than it adds."""
    if not me.shares_host:
        return False
    if view.feeding:
        return bool(_accelerators(view))
    return host_sits_out(view, me)


def host_sits_out(view: QueueView, device: DeviceView) -> bool:
    """Whether a device on the host's CPU leaves all the work to the accelerators: its
    best share of it is below MIN_HOST_SHARE (see `host_waits`)."""
    if not device.shares_host:
        return False
    accelerators = _accelerators(view)
    total = device.rate + sum(d.rate for d in accelerators)
    return bool(accelerators) and device.rate < MIN_HOST_SHARE * total


def gathers_first(view: QueueView, me: DeviceView) -> bool:
    """Whether a device with a batch in flight should let what is queued gather rather than
    launch it now: when the device would run all of it in less time than a launch holds the
    host's thread (a few short texts on a GPU). Launched at once, each such batch takes a
    text or two, and the launches, not the device, set the pace (16 clients of one text
    each made one-text batches). Left to gather until the batch in flight is collected, the
    texts that arrive meanwhile go in one launch; a lone request still starts at once, on a
    device holding nothing."""
    return bool(me.holding) and me.seconds(view.pending_tokens) < me.launch_s


def better_left_to_faster(view: QueueView, me: DeviceView) -> bool:
    """Whether, while texts are still arriving, a device should leave what is queued to
    faster devices that would finish all of it, after what they hold, before it could
    finish its own batch.

    Arriving texts wake every device, and whichever runs first would claim them: often a
    slow one, while a fast one's batches in flight are done but not yet collected. When
    the feed sets the pace, that slow batch only costs the host a launch and risks ending
    last (MiniLM beside a GPU slowed by a co-tenant ran 17% slower than on the fast GPU
    alone). Once every text is queued, the end game in `tail_target` decides who takes
    what."""
    if not view.feeding:
        return False
    order = ranked(view)
    # not a host device: it waits while texts are fed (`host_waits`)
    faster = [d for d in order[: order.index(me)] if not d.shares_host]
    if not faster:
        return False
    mine = finish_at(view, me, min(me.budget, view.pending_tokens))
    return drain_time(view, faster, view.pending_tokens) <= mine


def tail_target(view: QueueView, me: DeviceView, end: End) -> int | None:
    """The real tokens to claim: up to the device's budget or, near the end of the work,
    the share it can finish before the other devices would finish everything else.
    None when the device would finish even one item after the others finish it all."""
    budget = me.budget
    if not me.known:
        # A small first batch from the short end measures a device whose speed is only
        # a guess; counting its fixed cost as rate errs on the slow, safe side.
        return max(1, budget // 16)
    # not a host device that sits out: counting on it to drain the rest would cut this
    # device's last batches small for nothing
    others = [d for d in view.devices if d is not me and not host_sits_out(view, d)]
    if not others:
        return budget
    # While texts are still being tokenized, the end is not near: what is queued now is
    # only part of the work, and balancing it as if it were all would cut tiny batches.
    remaining = view.pending_tokens + view.unfed_tokens
    # Launching holds the one host thread: the others' launches wait for this one. When
    # the host is the limit (MiniLM beside a co-tenant-slowed GPU), a small last batch on
    # a slow device costs more than it saves.
    host = me.launch_s
    now = view.now

    def mine(tokens: float) -> float:
        return finish_at(view, me, tokens)

    shortest = float(view.shortest or 1)

    def theirs(tokens: float) -> float:
        left = remaining - tokens
        if 0 < left < shortest:
            left = shortest  # work is whole items: a sliver left over is one more item
        return drain_time(view, others, left, host_free=now + host if tokens else now)

    def makespan(tokens: float) -> float:
        return max(mine(tokens), theirs(tokens)) if tokens > 0 else theirs(0.0)

    high = min(float(budget), remaining)
    if mine(high) <= theirs(high):
        return budget
    # Near the end: take the amount that ends all the work soonest. Finishing times cross
    # between one item and `high`; taking everything (`high`) or nothing can still win,
    # since whoever takes a leftover pays one more batch's fixed cost.
    first = min(float(view.first_length(end) or 1), high)
    low, top = first, high
    if mine(first) <= theirs(first):
        for _ in range(30):
            middle = (low + top) / 2
            if mine(middle) <= theirs(middle):
                low = middle
            else:
                top = middle
    best = min((high, low, 0.0), key=makespan)  # ties go to the larger claim
    if best > 0:
        return max(1, math.ceil(best))
    if not any(d.holding for d in view.devices) and me is first_to_progress(view):
        return max(1, math.ceil(first))  # nobody is working: progress first
    return None


def first_to_progress(view: QueueView) -> DeviceView | None:
    """The device that claims when every device would rather leave the rest to others:
    the fastest that does not sit out (a host device ranked first by its rate at its full
    budget, beside accelerators whose budgets shrank, would leave it to nobody)."""
    return next((d for d in ranked(view) if not host_sits_out(view, d)), None)


def finish_at(view: QueueView, device: DeviceView, tokens: float) -> float:
    """When the device would finish a batch of `tokens` claimed now: after the claims it
    holds, and not before the batch is launched (launching holds the host's one thread).
    A device whose batches stray from its fit plans on the slow side, for the claims it
    holds too: ending late holds up all the work, ending early only leaves the others a
    little more."""
    now = view.now
    margin = 1 + device.spread
    held = (device.free_at - now) * margin
    return now + max(held, device.launch_s) + device.seconds(tokens) * margin


def drain_time(
    view: QueueView,
    devices: Sequence[DeviceView],
    tokens: float,
    host_free: float | None = None,
) -> float:
    """When `devices` together would finish their own claims plus `tokens` more.

    Each device starts once its claims are done and its next batch is launched (the host
    thread is free from `host_free` on), then runs full batches, each paying the fixed
    cost, then one partial batch. Devices not yet measured are not counted on: their
    speed is only a guess.
    """
    helpers = [d for d in devices if d.known] or list(devices)
    launched = view.now if host_free is None else host_free
    last_free = max(d.free_at for d in devices)
    if tokens <= 0:
        return last_free
    # (starts at, a full batch's seconds, budget, fixed, rate) of each: read once, as
    # `capacity` runs 40 times a call and a claim near the end makes dozens of calls
    free = [
        (max(d.free_at, launched + d.launch_s), d.seconds(d.budget), d.budget, d.fixed, d.rate)
        for d in helpers
    ]

    def capacity(at: float) -> float:
        total = 0.0
        for free_at, full_s, budget, fixed, rate in free:
            running = at - free_at
            if running <= 0:
                continue
            full = math.floor(running / full_s)
            partial = (running - full * full_s - fixed) * rate
            total += full * budget + min(budget, max(0.0, partial))
        return total

    low = min(f[0] for f in free)
    high = max(f + (fixed + tokens / rate) for f, _, _, fixed, rate in free)  # one device alone
    for _ in range(40):
        middle = (low + high) / 2
        if capacity(middle) >= tokens:
            high = middle
        else:
            low = middle
    return max(last_free, high)


def _accelerators(view: QueueView) -> list[DeviceView]:
    """The active devices that do not compute on the host's CPU."""
    return [d for d in view.devices if not d.shares_host]
