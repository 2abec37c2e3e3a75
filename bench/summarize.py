"""One line per bench JSON: the figures that matter, for a quick read of a run's output."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from common import paired_ratio


def _control(data: dict[str, Any]) -> str:
    """The second engine on the fastest device alone (mixed.py --control), and the converging
    queue round by round against it: both were loaded after the first engine alone."""
    control = data["control"]
    against = paired_ratio(data["converging"]["runs_s"], control["runs_s"])
    return (
        f"control {control['makespan_s']:.3f}s (paired {data['control_vs_alone_paired']:.3f}; "
        f"converging against it, paired {against:.3f}) "
    )


def line(path: Path) -> str:
    data = json.loads(path.read_text())
    kind = data.get("benchmark")
    if kind == "throughput":
        rates = {k: round(v["tokens_per_s"] / 1e3) for k, v in data["methods"].items()}
        gpu = data["methods"]["embedx"]["devices"][0]
        return (
            f"{data['model']}: k tok/s {rates} acc {data['accuracy_vs_float32']} "
            f"busy {gpu['busy_s']}s of {data['methods']['embedx']['seconds']:.2f}s"
        )
    if kind == "mixed":
        shares = {k: v["token_share"] for k, v in data["converging"]["devices"].items()}
        idle = {k: v["end_idle_s"] for k, v in data["converging"]["devices"].items()}
        static = {
            k: round(v["makespan_s"], 3) for k, v in data.get("static", {}).items() if k != "search"
        }
        alone = data["fastest_alone"]["makespan_s"]
        ours = data["converging"]["makespan_s"]
        return (
            f"mixed {data['model']} {data['devices']}: alone {alone:.3f}s converging {ours:.3f}s "
            f"ratio {data['converging_vs_alone']:.3f} "
            f"(paired {data.get('converging_vs_alone_paired', float('nan')):.3f}) "
            + (_control(data) if "control" in data else "")
            + f"shares {shares} end idle {idle} "
            f"static {static}"
        )
    if kind == "load":
        server, library = data["server"], data["library"]
        tokenizer = server.get("devices", {}).get("tokenizer", {})
        return (
            f"load {data['model']} {data['clients']} clients x {data['texts_per_request']} texts: "
            f"server {server['tokens_per_s'] / 1e3:.0f}k tok/s, "
            f"{server['requests_per_s']:.1f} req/s, "
            f"p50 {server['latency_p50_s']:.3f}s p99 {server['latency_p99_s']:.3f}s; library "
            f"{library['tokens_per_s'] / 1e3:.0f}k tok/s "
            f"(main thread {library.get('main_thread_us_per_text')} us/text); "
            f"ratio {data['server_vs_library']:.3f}; "
            f"in engine p50 {server.get('in_engine_p50_s')}s (tokenizing "
            f"{server.get('tokenizing_p50_s')}s); client decoding p50 "
            f"{server.get('client_decoding_p50_s')}s; busy "
            f"{ {k: v['busy_fraction'] for k, v in server.get('devices', {}).items()} }; "
            f"taking ids out {tokenizer.get('collect_fraction')}; "
            f"cpu {server.get('cpu')}"
        )
    return f"{kind}: " + json.dumps({k: v for k, v in data.items() if k != "environment"})[:600]


if __name__ == "__main__":
    for name in sys.argv[1:]:
        try:
            print(line(Path(name)))
        except Exception as exc:  # a missing or partial file: say so and go on
            print(f"{name}: {type(exc).__name__}: {exc}")
