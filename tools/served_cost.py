"""What one verify round costs on a vLLM server, by the two routes ``ServedVerifier`` can take, against the server's
own decode step (BENCHMARKS.md, "A target served by vLLM").

Usage: ``python tools/served_cost.py --url http://127.0.0.1:8011`` with a server running the default target
(``tests/test_served.py`` shows how one is started). For each context length: the context is sent once (the round
before, warming the prefix cache), then the best of two tries of a chain of 4 verified by prompt logprobs (one
prompt), by one prompt per row (five prompts, no prompt logprobs), and of a plain decode step (one token, one
request: what a served plain round costs); beside them the server's own decode step, the mean inter-token latency
(its ``vllm:inter_token_latency_seconds`` counters) of a 33-token completion of the context, where each token
continues a running request.
"""

from __future__ import annotations

import argparse
import time

from specviz.engine.served import ServedClient
from specviz.errors import SpecvizError, exit_status

CHAIN = [504, 1543, 282, 3000]


def seconds(client: ServedClient, prompts: list[list[int]], **options) -> float:
    """The best of two timed requests."""
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        client.complete(prompts, **options)
        best = min(best, time.perf_counter() - start)
    return best


def own_step_ms(client: ServedClient, context: list[int], tokens: int = 33) -> float | None:
    """The server's own decode step in ms: the inter-token latency its counters add up over one completion."""
    def counters() -> tuple[float, float]:
        found = {"_sum": 0.0, "_count": 0.0}
        for line in client.metrics().splitlines():
            for end in found:
                if line.startswith(f"vllm:inter_token_latency_seconds{end}{{"):
                    found[end] += float(line.rsplit(" ", 1)[1])
        return found["_sum"], found["_count"]

    before = counters()
    client.complete([context], max_tokens=tokens, logprobs=None)
    after = counters()
    steps = after[1] - before[1]
    return 1000.0 * (after[0] - before[0]) / steps if steps else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/served_cost.py", description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the server's base URL")
    parser.add_argument("--contexts", default="64,256,512,1024", help="context lengths in tokens, comma-separated")
    args = parser.parse_args(argv)

    def run() -> int:
        lengths = [n.strip() for n in args.contexts.split(",")]
        if not all(n.isdigit() and int(n) >= 1 for n in lengths):
            raise SpecvizError(f"--contexts takes context lengths of 1 or more tokens, got {args.contexts!r}")
        client = ServedClient(args.url)
        print("| context tokens | prompt logprobs, chain of 4 | one prompt per row | plain decode step "
              "| the server's own decode step |")
        print("|---|---|---|---|---|")
        for length in map(int, lengths):
            context = [11 + length, *[(7 * i) % 5000 + 100 for i in range(length - 1)]]
            client.complete([context])  # the previous round: the context is in the prefix cache
            by_logprobs = seconds(client, [context + CHAIN], prompt_logprobs=1)
            per_row = seconds(client, [context + CHAIN[:i] for i in range(len(CHAIN) + 1)])
            plain = seconds(client, [context + CHAIN[:1]])
            own = own_step_ms(client, context)
            own_text = "–" if own is None else f"{own / 1000:.3f} s"
            print(f"| {length} | {by_logprobs:.2f} s | {per_row:.2f} s | {plain:.3f} s | {own_text} |")
        return 0
    return exit_status(run)


if __name__ == "__main__":
    raise SystemExit(main())
