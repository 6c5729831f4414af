"""Canonical hashing throughput: ``content_hash`` of a ≈1 MB nested state, in MB/s.

The state (seeded, so every run hashes the same bytes) is what a pipeline's state looks like
when it is large: a list of records (dicts of strings, ints, floats, booleans, None, nested
lists and dicts, non-ASCII text), a chat transcript and a table of numbers. Two sides alternate
in every round, medians of the rounds:

* ``rewind``: :func:`rewind.canonical.content_hash` (canonical JSON per RFC 8785 with Rewind's
  deviations, UTF-8, SHA-256) — what every state field, node input and cache key goes through;
* ``baseline``: ``json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` +
  SHA-256 — the stdlib's fastest "sorted JSON then hash", which is *not* canonical (key order by
  code point instead of UTF-16, floats by ``repr``) but sets the floor of what Python can do.

MB/s = canonical bytes (10^6 bytes = 1 MB) / median seconds. Figures (last line, JSON):
``canonical_hash_mb_per_s`` (target ≥ 50), ``stdlib_json_hash_mb_per_s``,
``canonical_vs_stdlib_ratio`` (time ratio, rewind / baseline), ``state_bytes``.

Run: ``.venv/bin/python benchmarks/canonical_hashing.py [--quick]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import time
from typing import Any

from rewind.canonical import canonical_bytes, content_hash

TARGET_MB_PER_S = 50.0
WORDS = [
    *[
        "rain",
        "sun",
        "fog",
        "wind",
        "cloud",
        "drizzle",
        "snow",
        "mean",
        "max",
        "min",
        "temperature",
        "seattle",
        "week",
        "month",
    ],
    *[
        "trend",
        "warm",
        "cold",
        "wet",
        "dry",
        "station",
        "daily",
        "record",
        "average",
        "median",
        "anomaly",
        "summary",
    ],
    *["café", "naïve", "Zürich", "東京", "🌧️", "«quoted»", "tab\there", "line\nbreak"],
]


def nested_state(target_bytes: int, seed: int = 13) -> dict[str, Any]:
    """A seeded nested state whose canonical JSON is about ``target_bytes`` long."""
    rng = random.Random(seed)

    def text(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    def record(i: int) -> dict[str, Any]:
        return {
            "id": i,
            "name": text(3),
            "score": round(rng.uniform(-100, 100), rng.randint(0, 6)),
            "ok": rng.random() < 0.5,
            "missing": None,
            "tags": [text(1) for _ in range(rng.randint(0, 5))],
            "point": {"lat": rng.uniform(-90, 90), "lon": rng.uniform(-180, 180), "alt": i * 3},
            "history": [
                {"t": 1_700_000_000 + j, "v": rng.randint(-(10**9), 10**9)} for j in range(3)
            ],
            "note": text(rng.randint(5, 40)),
        }

    state: dict[str, Any] = {
        "records": [],
        "transcript": [],
        "table": [],
        "config": {"model": "gpt-4o-mini", "temperature": 0.2, "max_tokens": 512, "seed": 7},
    }
    size = 0
    i = 0
    while size < target_bytes:
        state["records"].append(record(i))
        role = ("system", "user", "assistant")[i % 3]
        state["transcript"].append({"role": role, "content": text(rng.randint(10, 60))})
        state["table"].append([rng.randint(0, 10**6) for _ in range(8)] + [rng.random()])
        i += 1
        if i % 64 == 0:
            size = len(canonical_bytes(state))
    return state


def _stdlib_hash(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small version for smoke tests")
    parser.add_argument("--mb", type=float, default=1.0, help="state size in MB (default 1)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 15)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 15)
    state = nested_state(int(args.mb * 1_000_000))
    size = len(canonical_bytes(state))
    content_hash(state)  # warm-up
    _stdlib_hash(state)
    sides = {"rewind": content_hash, "baseline": _stdlib_hash}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            start = time.perf_counter()
            sides[name](state)
            times[name].append(time.perf_counter() - start)
    rewind_s = statistics.median(times["rewind"])
    base_s = statistics.median(times["baseline"])
    mb_per_s = size / 1e6 / rewind_s
    base_mb_per_s = size / 1e6 / base_s
    verdict = "meets" if mb_per_s >= TARGET_MB_PER_S else "MISSES"
    print(f"state: {size:,} canonical bytes, {len(state['records'])} records; {rounds} rounds")
    print(
        f"rewind content_hash:     {rewind_s * 1000:.1f} ms  {mb_per_s:.1f} MB/s ({verdict} ≥ 50)"
    )
    print(f"json.dumps + sha256:     {base_s * 1000:.1f} ms  {base_mb_per_s:.1f} MB/s")
    return {
        "canonical_hash_mb_per_s": round(mb_per_s, 2),
        "canonical_hash_target_mb_per_s": TARGET_MB_PER_S,
        "stdlib_json_hash_mb_per_s": round(base_mb_per_s, 2),
        "canonical_vs_stdlib_ratio": round(rewind_s / base_s, 3),
        "state_bytes": size,
        "rounds": rounds,
    }


if __name__ == "__main__":
    figures = main(sys.argv[1:])
    print(json.dumps(figures))
