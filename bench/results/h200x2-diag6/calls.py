"""Summarize tokcalls-*.jsonl (sitecustomize.py of this folder): per tokenizer call of more
than 100 texts, how fast it encoded, and how long it waited to start and to be handed out.

    python3 calls.py tokcalls-library.jsonl tokcalls-server.jsonl
"""

import json
import statistics
import sys

for path in sys.argv[1:]:
    with open(path) as lines:
        rows = [r for r in map(json.loads, lines) if r["texts"] > 100]
    encode = [r["ended"] - r["began"] for r in rows]
    texts = [r["texts"] for r in rows]
    pickup = sorted(r["began"] - r["queued"] for r in rows)
    hand_out = sorted(r["handed_out"] - r["ended"] for r in rows)
    span = rows[-1]["handed_out"] - rows[0]["queued"]
    summary = {
        "calls": len(rows),
        "mean_call_texts": round(statistics.mean(texts)),
        "texts_per_s_while_encoding": round(sum(texts) / sum(encode)),
        "process_cores_while_encoding": round(
            statistics.median(r["cpu_s"] / (r["ended"] - r["began"]) for r in rows), 1
        ),
        "start_wait_ms_median": round(1e3 * statistics.median(pickup), 1),
        "hand_out_wait_ms_median": round(1e3 * statistics.median(hand_out), 1),
        "hand_out_wait_ms_p90": round(1e3 * hand_out[int(0.9 * len(hand_out))], 1),
        "encoding_share_of_span": round(sum(encode) / span, 3),
    }
    print(path, json.dumps(summary))
