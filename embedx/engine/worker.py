"""The device loop: one task per device claims batches from the model's queue, launches them on
the device (the next before the current is awaited), and writes each batch's rows to its
requests."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from embedx.devices import Launch
from embedx.engine.outputs import RowForm, batch_form, sole_job, write_batch
from embedx.engine.replica import Replica
from embedx.errors import DeviceHung
from embedx.scheduling import Claim, ConvergingQueue, DeviceSlot
from embedx.telemetry import BATCH_ITEM_BUCKETS, TOKEN_BUCKETS, Histogram

if TYPE_CHECKING:
    import torch

    from embedx.scheduling import Job

log = logging.getLogger("embedx.engine")

HANG_FACTOR = 20  # a batch taking this many times its expected time marks its device hung


@dataclass(slots=True)
class _InFlight:
    """A launched batch, with what its delivery needs to know about its requests."""

    claim: Claim
    launched: Launch[torch.Tensor]
    sole_job: Job | None  # the one request of all its texts, if there is just one
    form: RowForm  # what the device made of the rows


class DeviceWorker:
    """Claims batches for one device and runs them, keeping up to `max_inflight` launched."""

    def __init__(
        self, queue: ConvergingQueue, replica: Replica, slot: DeviceSlot, batch_timeout_s: float
    ) -> None:
        self.queue = queue
        self.replica = replica
        self.slot = slot
        self.batch_timeout_s = batch_timeout_s
        self.batch_tokens = Histogram(TOKEN_BUCKETS)
        self.batch_items = Histogram(BATCH_ITEM_BUCKETS)
        self.padding_rows = 0  # rows a GPU computed past the real tokens (bucketed counts)
        self.graph_batches = 0  # batches replayed as CUDA graphs (graphs.py)
        self._launches = 0

    async def run(self) -> None:
        accelerator = self.replica.accelerator
        inflight: list[_InFlight] = []
        try:
            while self.slot.active:
                while len(inflight) < accelerator.max_inflight:
                    claim = self.queue.claim(self.slot)
                    if claim is None:
                        break
                    sole = sole_job(claim.items)
                    form = batch_form(claim.items, sole)
                    launched = self._launch(claim, form)
                    if launched is None:  # its copies may still read the slot: not on the loop
                        await asyncio.to_thread(accelerator.synchronize)
                    else:
                        inflight.append(_InFlight(claim, launched, sole, form))
                if not inflight:
                    await self.queue.wait_for_work(self.slot)
                    continue
                batch = inflight[0]
                claim = batch.claim
                deadline = max(self.batch_timeout_s, HANG_FACTOR * claim.expected_s)
                try:
                    output, seconds = await accelerator.result(
                        batch.launched, deadline, claim.expected_s
                    )
                except DeviceHung as exc:
                    log.error("%s", exc)
                    self.queue.quarantine(self.slot, str(exc))
                    return
                except Exception as exc:
                    inflight.pop(0)
                    self._failed(claim, exc)
                    continue
                inflight.pop(0)
                try:
                    self._deliver(batch, output, seconds)
                except Exception as exc:  # its rows could not be written: a failed batch
                    self._failed(claim, exc)
        finally:
            # Cancelled or quarantined: what this worker still holds goes back to the queue.
            for batch in inflight:
                self.queue.release(batch.claim)

    def _launch(self, claim: Claim, form: RowForm) -> Launch[torch.Tensor] | None:
        # With at most max_inflight batches out, the slot used max_inflight launches ago
        # belongs to a batch that is done. Only launches that happened count: after a failed
        # one, the next must not take the slot of a batch still running.
        slot = self._launches % self.replica.accelerator.max_inflight
        started = time.perf_counter()
        try:
            host = self.replica.pack([item.ids for item in claim.items], slot, self.slot.budget)
            launched = self.replica.accelerator.launch(lambda: self.replica.run(host, slot, form))
            self.padding_rows += host.rows - host.tokens
            self.graph_batches += host.graph is not None
        except Exception as exc:
            self._failed(claim, exc)
            return None
        self._launches += 1
        self.slot.observe_launch(time.perf_counter() - started)
        return launched

    def _failed(self, claim: Claim, exc: Exception) -> None:
        oom = self.replica.accelerator.is_out_of_memory(exc)
        log.warning(
            "%s: batch of %d texts (%d tokens) failed%s: %r",
            self.slot.name,
            len(claim.items),
            claim.tokens,
            " (out of memory: halving its budget)" if oom else "",
            exc,
        )
        self.queue.fail(claim, exc, out_of_memory=oom)

    def _deliver(self, batch: _InFlight, output: torch.Tensor, seconds: float) -> None:
        claim = batch.claim
        if not self.queue.holds(claim):
            return  # revoked: the device was quarantined, others ran these items
        rows = output.numpy()  # host memory: pinned staging, valid until the next launch
        write_batch(claim.items, batch.sole_job, rows, batch.form, self.replica.taken(output))
        self.batch_tokens.observe(claim.tokens)
        self.batch_items.observe(len(claim.items))
        self.queue.complete(claim, seconds)
