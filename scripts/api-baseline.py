#!/usr/bin/env python3
"""The public API of `import Fanout`, kept as a text baseline (api/Fanout.txt) that CI checks.

Runs the toolchain's swift-api-digester (-dump-sdk) on Fanout and the modules it re-exports (FanoutCore,
FanoutPolicy, FanoutRegistry) from a build's module directory, and flattens each public declaration into one
line: `Module: Parent.child: printed declaration`. With `--update` it writes api/Fanout.txt; without, it fails,
printing the lines added and removed, when the baseline differs, so that a change to the public surface is a
deliberate, visible diff. `--build-dir DIR` names the build (default .build/lint, which `make lint` builds).
"""
import json
import os
import subprocess
import sys
import tempfile

MODULES = ["Fanout", "FanoutCore", "FanoutPolicy", "FanoutRegistry"]
BASELINE = "api/Fanout.txt"
# Kinds that are not declarations a caller uses (they would only add noise to the diff).
SKIPPED_KINDS = {"Import", "TypeNominal", "TypeNameAlias", "TypeFunc", "Conformance", "TypeWitness"}


def dump(module, build):
    triple_dir = os.path.realpath(build)
    modules = os.path.join(triple_dir, "Modules")
    includes = ["Sources/CLibUV", "Sources/CNGHTTP2", "Sources/COpenSSL", "Sources/CSQLite", "Sources/CHiredis",
                "Sources/CFanoutShims/include", os.path.join(triple_dir, "CFanoutShims.build")]
    with tempfile.NamedTemporaryFile(suffix=".json") as output:
        command = ["swift-api-digester", "-dump-sdk", "-module", module, "-I", modules, "-o", output.name,
                   "-avoid-location"]
        for include in includes:
            command += ["-I", include]
        result = subprocess.run(command, capture_output=True, text=True)
        root = json.load(open(output.name))["ABIRoot"]
        if root.get("name") != module:
            sys.exit(f"swift-api-digester could not load {module} from {modules}: {result.stderr.strip()}")
        return root


def lines(node, module, path, out):
    for child in node.get("children", []):
        kind = child.get("kind", "")
        # `package` declarations are in the dump too, marked internal: they are not a library user's API.
        if kind in SKIPPED_KINDS or child.get("isInternal"):
            continue
        name = child.get("name", "")
        printed = child.get("printedName", name)
        # A declaration's own module: members of another module's types (extensions) keep theirs.
        owner = child.get("moduleName", module)
        where = ".".join(path + [name]) if name else ".".join(path)
        out.add(f"{owner}: {where}: {child.get('declKind', kind)} {printed}")
        if kind in ("TypeDecl", "Var", "Function", "Constructor", "Subscript", "TypeAlias", "AssociatedType"):
            if kind == "TypeDecl":
                lines(child, owner, path + [name], out)


def main():
    arguments = sys.argv[1:]
    build = ".build/lint/debug"
    if "--build-dir" in arguments:
        build = arguments[arguments.index("--build-dir") + 1]
    found = set()
    for module in MODULES:
        lines(dump(module, build), module, [], found)
    current = sorted(line for line in found if line.split(": ", 1)[0] in MODULES)
    text = "\n".join(current) + "\n"
    if "--update" in arguments:
        os.makedirs(os.path.dirname(BASELINE), exist_ok=True)
        open(BASELINE, "w", encoding="utf-8").write(text)
        print(f"api baseline: {len(current)} public declarations written to {BASELINE}")
        return
    baseline = open(BASELINE, encoding="utf-8").read().splitlines() if os.path.exists(BASELINE) else []
    added = sorted(set(current) - set(baseline))
    removed = sorted(set(baseline) - set(current))
    if added or removed:
        print(f"the public API differs from {BASELINE} (scripts/api-baseline.py --update records a change "
              "made on purpose):", file=sys.stderr)
        for line in removed:
            print(f"  - {line}", file=sys.stderr)
        for line in added:
            print(f"  + {line}", file=sys.stderr)
        sys.exit(1)
    print(f"api baseline: the {len(current)} public declarations of import Fanout match {BASELINE}")


if __name__ == "__main__":
    main()
