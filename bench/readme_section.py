"""Replaces the text between <!-- NAME:begin --> and <!-- NAME:end --> in bench/README.md with a
results file, written by the benchmark scripts from one fresh run.

Usage: /usr/bin/python3 bench/readme_section.py NAME RESULTS.md
"""

import os
import sys


def main(name, results):
    readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "README.md")
    text = open(readme).read()
    b, e = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    i, j = text.find(b), text.find(e)
    if i < 0 or j < i:
        sys.exit(f"bench/README.md has no {name} markers")
    new = text[:i + len(b)] + "\n" + open(results).read() + text[j:]
    tmp = readme + ".tmp"
    with open(tmp, "w") as f:
        f.write(new)
    os.replace(tmp, readme)


if __name__ == "__main__":
    main(*sys.argv[1:3])
