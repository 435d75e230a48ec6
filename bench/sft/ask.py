"""Asks a running `tlm serve` the held-out questions (greedy, OpenAI's chat completions API) and
prints what it answered as JSON: the share whose answer names the right value (accuracy), the
share in the cited style ("The notes say ..."), the share word for word one of the two expected
answers, and the first question with its answer.

Usage: /usr/bin/python3 bench/sft/ask.py URL HELDOUT.jsonl [PARALLEL]
"""

import json
import re
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def ask(url, ex):
    body = json.dumps({"messages": ex["messages"], "temperature": 0, "max_tokens": 40}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)["choices"][0]["message"]["content"].strip()


def main(url, path, parallel=4):
    exs = [json.loads(line) for line in open(path)]
    with ThreadPoolExecutor(int(parallel)) as pool:
        answers = list(pool.map(lambda e: ask(url, e), exs))
    right = cited = exact = 0
    for ex, a in zip(exs, answers):
        right += re.search(r"\b%s\b" % re.escape(ex["value"]), a, re.IGNORECASE) is not None
        cited += a.startswith("The notes say")
        exact += a in (ex["plain"], ex["cited"])
    n = len(exs)
    print(json.dumps({"n": n, "accuracy": right / n, "cited": cited / n, "exact": exact / n,
                      "question": exs[0]["messages"][-1]["content"], "answer": answers[0]}))


if __name__ == "__main__":
    main(*sys.argv[1:])
