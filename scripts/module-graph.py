#!/usr/bin/env python3
"""The module graph in docs/ARCHITECTURE.md against the package's own.

docs/ARCHITECTURE.md holds, between the lines `<!-- module-graph -->` and `<!-- /module-graph -->`, a code block with
one line per target: `Target -> DepA DepB` (targets it depends on, in any order; `-> ` with nothing after for none).
This script reads `swift package describe --type json` and fails, naming each difference, when a target or an edge is
in one and not the other. `--print` prints the block as the package has it, to paste in after a change.
"""
import json
import re
import subprocess
import sys

DOC = "docs/ARCHITECTURE.md"
BEGIN, END = "<!-- module-graph -->", "<!-- /module-graph -->"


def package_graph():
    described = subprocess.run(
        ["swift", "package", "describe", "--type", "json"], check=True, capture_output=True, text=True
    ).stdout
    # SwiftPM may print lines before the JSON (warnings, fetch notes): the JSON starts at the first brace.
    package = json.loads(described[described.index("{"):])
    return {
        target["name"]: set(target.get("target_dependencies", [])) | set(target.get("product_dependencies", []))
        for target in package["targets"]
    }


def documented_graph():
    text = open(DOC, encoding="utf-8").read()
    match = re.search(re.escape(BEGIN) + r"(.*?)" + re.escape(END), text, re.S)
    if not match:
        sys.exit(f"{DOC}: no block between {BEGIN} and {END}")
    graph = {}
    for number, line in enumerate(match.group(1).splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("```"):
            continue
        if "->" not in line:
            sys.exit(f"{DOC}: module graph line {number} is not `Target -> Dependencies`: {line}")
        name, _, dependencies = line.partition("->")
        graph[name.strip()] = set(dependencies.split())
    return graph


def block(graph):
    width = max(len(name) for name in graph)
    lines = [f"{name.ljust(width)} -> {' '.join(sorted(graph[name]))}".rstrip() for name in sorted(graph)]
    return "\n".join([BEGIN, "```text", *lines, "```", END])


def main():
    actual = package_graph()
    if "--print" in sys.argv[1:]:
        print(block(actual))
        return
    drawn = documented_graph()
    problems = []
    for name in sorted(actual.keys() - drawn.keys()):
        problems.append(f"target {name} is in Package.swift but not drawn")
    for name in sorted(drawn.keys() - actual.keys()):
        problems.append(f"target {name} is drawn but not in Package.swift")
    for name in sorted(actual.keys() & drawn.keys()):
        for dependency in sorted(actual[name] - drawn[name]):
            problems.append(f"edge {name} -> {dependency} is in Package.swift but not drawn")
        for dependency in sorted(drawn[name] - actual[name]):
            problems.append(f"edge {name} -> {dependency} is drawn but not in Package.swift")
    if problems:
        print(f"{DOC} and Package.swift disagree (scripts/module-graph.py --print gives the block):", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        sys.exit(1)
    print(f"module graph: {DOC} draws the package's {len(actual)} targets and their edges")


if __name__ == "__main__":
    main()
