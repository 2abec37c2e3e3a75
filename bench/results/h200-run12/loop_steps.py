"""The event-loop thread's share of the interpreter lock, step by step, from py-spy's --gil
stacks (`load.py --py-spy PREFIX --gil`): which of embedx's steps the loop held the lock
in, in seconds (samples / 200 a second), the server's and the library's side by side.

    python3 loop_steps.py 4-stacks-server.txt.gz 4-stacks-library.txt.gz
"""

from __future__ import annotations

import collections
import gzip
import sys

RATE = 200  # py-spy's samples a second (bench/common.py SPY_RATE)
# (a frame's text, its step): a stack counts for its innermost frame that one names
STEPS = [
    ("_Exchange.respond", "HTTP: granian's response_bytes"),
    ("_Exchange.receive", "HTTP: reading the body"),
    ("RsgiBridge", "HTTP: RSGI bridge"),
    ("_asgi_scope", "HTTP: RSGI bridge"),
    ("Edge._dispatch", "HTTP: edge (tasks, disconnect watch)"),
    ("Edge.__call__", "HTTP: edge"),
    ("parse_openai", "HTTP: parsing and checking the body"),
    ("Base64Items", "HTTP: the response's items"),
    ("_item_heads", "HTTP: the response's items"),
    ("Application", "HTTP: BlackSheep"),
    ("Encoded.views", "engine: a view a text"),
    ("chunk_items", "engine: an item a text"),
    ("ConvergingQueue.submit", "engine: queueing"),
    ("ConvergingQueue.claim", "engine: claiming a batch"),
    ("Replica.pack", "engine: packing a batch"),
    ("CudaAccelerator.launch", "engine: launching (torch calls)"),
    ("Replica.run", "engine: launching (torch calls)"),
    ("_deliver", "engine: writing rows, completing"),
    ("CudaAccelerator.result", "engine: polling the batch's event"),
    ("DeviceWorker.run", "engine: the worker's own"),
    ("_check_texts", "engine: checking texts"),
    ("Engine.embed", "engine: a request's own steps"),
    ("Engine._tokenize_into", "engine: a request's own steps"),
    ("create_embeddings", "HTTP: the handler's own steps"),
    ("_bound.<locals>.route", "HTTP: the handler's own steps"),
]


def steps(path: str) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as lines:
        for line in filter(str.strip, lines):
            stack, _, samples = line.strip().rpartition(" ")
            if "MainThread" not in stack.split(";")[0]:
                continue
            frames = reversed(stack.split(";")[1:])  # the innermost step that names one
            step = next((n for f in frames for text, n in STEPS if text in f), "other")
            counts[step] += int(samples)
    return counts


def main() -> None:
    server, library = steps(sys.argv[1]), steps(sys.argv[2])
    print(f"{'step':40} {'server s':>9} {'library s':>9}")
    for step, _ in (server + library).most_common():
        print(f"{step:40} {server[step] / RATE:9.3f} {library[step] / RATE:9.3f}")
    print(f"{'all':40} {sum(server.values()) / RATE:9.3f} {sum(library.values()) / RATE:9.3f}")


if __name__ == "__main__":
    main()
