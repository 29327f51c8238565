#!/usr/bin/env bash
# make docs: the reference of `import Fanout`, built with the toolchain's own tools and no SwiftPM plugin.
#
# 1. Builds the Fanout target (or, with `--build-dir DIR`, uses a build's modules already there: `make lint` passes
#    .build/lint/debug).
# 2. Extracts its symbol graph from the built module with swift-symbolgraph-extract, the public declarations of
#    Fanout and of the modules it re-exports (FanoutCore, FanoutPolicy, FanoutRegistry: what a gateway sees). Read
#    from the module, not emitted by the compiler (`-emit-symbol-graph`), so that the everyday build's flags, and so
#    its cache, stay as they are.
# 3. Runs `docc convert` on Sources/Fanout/Fanout.docc with that graph into .build/docs/Fanout.doccarchive, with
#    warnings as errors: a link to a symbol that does not exist, or a parameter documented by name that the
#    function does not have (or one missing beside documented ones), fails the build.
set -euo pipefail
cd "$(dirname "$0")/.."
swift=${SWIFT:-swift}
build=""
if [ "${1:-}" = "--build-dir" ]; then
    build=${2:?--build-dir takes a directory}
else
    "$swift" build --target Fanout
    build=$("$swift" build --show-bin-path)
fi
build=$(realpath "$build")
[ -f "$build/Modules/Fanout.swiftmodule" ] || { echo "docs: no Fanout module in $build/Modules" >&2; exit 1; }

# The tools sit beside the compiler in the toolchain.
toolchain=$(dirname "$(realpath "$(command -v "$swift")")")
find_tool() {
    if [ -x "$toolchain/$1" ]; then echo "$toolchain/$1"; else command -v "$1" || { echo "docs: $1 not found" >&2; exit 1; }; fi
}
extract=$(find_tool swift-symbolgraph-extract)
docc=$(find_tool docc)
triple=$("$swift" -print-target-info | python3 -c 'import json, sys; print(json.load(sys.stdin)["target"]["triple"])')

out=.build/docs
graphs=$out/symbol-graphs
rm -rf "$graphs" "$out/Fanout.doccarchive"
mkdir -p "$graphs"
includes=()
for dir in Sources/CLibUV Sources/CNGHTTP2 Sources/COpenSSL Sources/CSQLite Sources/CHiredis \
    Sources/CFanoutShims/include "$build/CFanoutShims.build"; do
    includes+=(-I "$dir")
done
"$extract" -module-name Fanout -target "$triple" -I "$build/Modules" "${includes[@]}" \
    -minimum-access-level public -experimental-allowed-reexported-modules=FanoutCore,FanoutPolicy,FanoutRegistry \
    -output-dir "$graphs"

"$docc" convert Sources/Fanout/Fanout.docc --additional-symbol-graph-dir "$graphs" \
    --output-path "$out/Fanout.doccarchive" --fallback-display-name Fanout --fallback-bundle-identifier Fanout \
    --warnings-as-errors
echo "docs: $out/Fanout.doccarchive (open $out/Fanout.doccarchive/index.html through a web server, or run" \
    "docc preview Sources/Fanout/Fanout.docc --additional-symbol-graph-dir $graphs)"
