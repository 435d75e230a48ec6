"""Synthetic instruction data for bench/sft/sft.sh: questions about invented people whose facts the
prompt's notes give (the base model cannot know them, and held-out people are new names), as chats
for SFT and as preference pairs between two styles of answer for DPO.

Usage: /usr/bin/python3 bench/sft/make_data.py OUTDIR

OUTDIR receives sft_train.jsonl, sft_val.jsonl (chats: the answer in the plain style),
dpo_train.jsonl, dpo_val.jsonl (pairs: chosen in the cited style, rejected in the plain one) and
heldout.jsonl (prompts of new people with the expected value, for accuracy), and mixed.jsonl
(chats whose notes number 1 to 12, most of them few: long-tailed lengths, for packing's speed).
"""

import json
import os
import random
import sys

SYL = ["zor", "ta", "vik", "mel", "qua", "bri", "lon", "sa", "dre", "ko", "fen", "ru", "nim",
       "pa", "gol", "ith", "ver", "ul", "cas", "mo"]
CITIES = ["Quenta", "Brall", "Osk", "Tirvane", "Melo", "Dunrast", "Pell", "Carvo", "Yllin",
          "Estrem", "Harrow", "Zimba"]
COLORS = ["red", "blue", "green", "yellow", "purple", "orange", "pink", "white", "black", "brown"]
PETS = ["cat", "dog", "fish", "bird", "frog", "rabbit", "snake", "horse", "mouse", "turtle"]
RELATIONS = [
    # (note, question, answer)
    ("{n} lives in {v}.", "Where does {n} live?", "{n} lives in {v}."),
    ("{n} likes the color {v}.", "Which color does {n} like?", "{n} likes the color {v}."),
    ("{n} has a pet {v}.", "What pet does {n} have?", "{n} has a pet {v}."),
]
VALUES = [CITIES, COLORS, PETS]


def name(rng):
    return "".join(rng.choice(SYL) for _ in range(2)).capitalize()


def example(rng, names, count=None):
    """Notes about 1 to 3 people (or count), one relation each, a question about one of them."""
    people = rng.sample(names, count or rng.randint(1, 3))
    notes, facts = [], []
    for p in people:
        k = rng.randrange(3)
        v = rng.choice(VALUES[k])
        notes.append(RELATIONS[k][0].format(n=p, v=v))
        facts.append((p, k, v))
    p, k, v = rng.choice(facts)
    user = "Notes: " + " ".join(notes) + " Question: " + RELATIONS[k][1].format(n=p)
    plain = RELATIONS[k][2].format(n=p, v=v)
    cited = "The notes say " + plain
    return user, plain, cited, v


def main(out):
    os.makedirs(out, exist_ok=True)
    rng = random.Random(7)
    names = sorted({name(rng) for _ in range(600)})
    rng.shuffle(names)
    seen, new = names[:300], names[300:]

    def chats(path, n, pool):
        with open(path, "w") as f:
            for _ in range(n):
                u, plain, _, _ = example(rng, pool)
                f.write(json.dumps({"messages": [{"role": "user", "content": u},
                                                 {"role": "assistant", "content": plain}]}) + "\n")

    def pairs(path, n, pool):
        with open(path, "w") as f:
            for _ in range(n):
                u, plain, cited, _ = example(rng, pool)
                f.write(json.dumps({"prompt": [{"role": "user", "content": u}],
                                    "chosen": [{"role": "assistant", "content": cited}],
                                    "rejected": [{"role": "assistant", "content": plain}]}) + "\n")

    chats(os.path.join(out, "sft_train.jsonl"), 3000, seen)
    chats(os.path.join(out, "sft_val.jsonl"), 100, new)
    pairs(os.path.join(out, "dpo_train.jsonl"), 1000, seen)
    pairs(os.path.join(out, "dpo_val.jsonl"), 100, new)
    with open(os.path.join(out, "heldout.jsonl"), "w") as f:
        for _ in range(200):
            u, plain, cited, v = example(rng, new)
            f.write(json.dumps({"messages": [{"role": "user", "content": u}],
                                "value": v, "plain": plain, "cited": cited}) + "\n")
    # after the rest, which it leaves as it was
    with open(os.path.join(out, "mixed.jsonl"), "w") as f:
        for _ in range(3000):
            u, plain, _, _ = example(rng, seen, min(12, 1 + int(rng.expovariate(1 / 2.5))))
            f.write(json.dumps({"messages": [{"role": "user", "content": u},
                                             {"role": "assistant", "content": plain}]}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
