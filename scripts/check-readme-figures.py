#!/usr/bin/env python3
"""Every figure in README.md's "Benchmarks" section is one docs/BENCHMARKS.md holds.

docs/BENCHMARKS.md is the one place for measured figures; the README shows a few headline ones. This
fails, naming them, when a number in the README's section (a rate, a ratio, a latency) appears nowhere in
docs/BENCHMARKS.md, so that the two cannot drift apart.
"""
import re
import sys

readme = open("README.md", encoding="utf-8").read()
benchmarks = open("docs/BENCHMARKS.md", encoding="utf-8").read()
match = re.search(r"^## Benchmarks\n(.*?)(?=^## )", readme, re.S | re.M)
if not match:
    sys.exit("README.md has no '## Benchmarks' section")
section = match.group(1)
# Figures: numbers with a decimal point or a thousands separator, or followed by a unit; plain small
# integers (list counts, "2 cores") are prose.
figures = set(re.findall(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+\.\d+)(?![\w.])", section))
missing = sorted(figure for figure in figures if figure not in benchmarks)
if missing:
    print("README.md's Benchmarks section has figures docs/BENCHMARKS.md does not:", ", ".join(missing),
          file=sys.stderr)
    sys.exit(1)
print(f"readme figures: all {len(figures)} are in docs/BENCHMARKS.md")
