"""A worker that owns a conversation thread while it runs, and hands the thread straight to the
next queued run: the pattern of Mastra's signals runtime, with sql_lease doing the renewing.

    python examples/thread_worker.py [DATABASE_URL]     (default: sqlite:///example.db)

Several runs arrive for the same thread at once. Each waits for the thread's lease, works while
holding it (renewed in the background, fence passed to what it writes), and when it is done hands
the lease to the next run in the queue with ``transfer_to``: no other worker can slip in between.
The last run releases it.
"""

from __future__ import annotations

import asyncio
import sys
from collections import defaultdict, deque

from sql_lease import LeaseLostError, SqlLeaseProvider

queued: dict[str, deque[str]] = defaultdict(deque)  # thread id -> run ids waiting for it (your queue)


async def do_the_work(run_id: str, thread_id: str, fence: int) -> None:
    # Write with the fence, so that a run which lost its lease is rejected by the store:
    #   UPDATE messages SET ... WHERE thread_id = :thread AND :fence >= last_fence
    await asyncio.sleep(0.2)


async def process(leases: SqlLeaseProvider, thread_id: str, run_id: str) -> None:
    queued[thread_id].append(run_id)
    try:
        async with leases.hold(f"thread:{thread_id}", owner=run_id, ttl_ms=15_000, wait=True, timeout_s=60) as lease:
            queued[thread_id].remove(run_id)
            print(f"{run_id} owns thread {thread_id} with fence {lease.fence}", flush=True)
            await do_the_work(run_id, thread_id, lease.fence)
            if queued[thread_id]:
                successor = queued[thread_id][0]
                if await lease.transfer_to(successor):
                    print(f"{run_id} handed thread {thread_id} to {successor}", flush=True)
    except LeaseLostError as lost:
        print(f"{run_id} lost thread {thread_id}: {lost.reason}", flush=True)  # stop; the next owner goes on


async def main(url: str) -> None:
    async with SqlLeaseProvider(url) as leases:
        if url.startswith("sqlite"):
            await leases.migrate()  # PostgreSQL: run `sql-lease migrate` in your deploy instead
        runs = [process(leases, "t-42", f"run-{n}") for n in range(1, 4)]
        await asyncio.gather(*runs)
        print(f"thread t-42 is free again: {await leases.get_lease_owner('thread:t-42') is None}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "sqlite:///example.db"))
