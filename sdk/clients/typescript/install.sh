#!/usr/bin/env bash
# Builds promptd-client as a real package and installs it, from that artifact, into a fresh
# folder where its examples and tests run (tests/client_typescript.rs drives them):
#
#   1. npm ci here (TypeScript, exactly as package-lock.json pins it), npm run build (tsc);
#   2. npm pack into .pack/ — the tarball a user would install;
#   3. .test-install/: a new folder with the pinned provider SDKs (tests/sdk_loops/js's
#      package.json and lock, so the very same `openai` and `@anthropic-ai/sdk` trees), then
#      the tarball installed into it, then examples/ and test/ copied in, so their
#      `import "promptd-client"` resolves to .test-install/node_modules/promptd-client — the
#      packed artifact, not this source tree. (test/tracing.test.mjs loads the OpenTelemetry
#      packages, devDependencies pinned in package-lock.json, from step 1's node_modules here.)
#
# Does nothing when its stamp (.test-install/.stamp: the sha256 of every input, listed below)
# matches; any change to the sources, the pins or this script rebuilds it all. Needs Node.js 18+
# with npm (Debian: apt-get install nodejs npm) and the npm registry.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
die() { echo "sdk/clients/typescript/install.sh: $*" >&2; exit 1; }
command -v node >/dev/null || die "node not found: apt-get install nodejs npm (Node.js 18 or later)"
command -v npm >/dev/null || die "npm not found: apt-get install npm"
major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$major" -ge 18 ] || die "Node.js $(node --version) is too old: promptd-client needs 18 or later"

sdks=../../../tests/sdk_loops/js
[ -f "$sdks/package-lock.json" ] || die "$sdks/package-lock.json is missing (the provider SDK pins)"

# Every input, by path relative to this folder; the Rust test checks the same list.
stamp_of() {
    sha256sum install.sh package.json package-lock.json tsconfig.json README.md \
        $(find src examples test -type f | LC_ALL=C sort) \
        "$sdks/package.json" "$sdks/package-lock.json"
}
if [ -f .test-install/.stamp ] && [ "$(cat .test-install/.stamp)" = "$(stamp_of)" ]; then
    exit 0
fi

quiet=(--no-audit --no-fund --loglevel=error)
npm ci "${quiet[@]}"
npm run --silent build

rm -rf .pack
mkdir .pack
# Built just above; a bare `npm pack` builds through the `prepack` script instead.
tarball="$(npm pack --ignore-scripts --silent --pack-destination .pack)"
[ -f ".pack/$tarball" ] || die "npm pack made no .pack/$tarball"

rm -rf .test-install
mkdir .test-install
cp "$sdks/package.json" "$sdks/package-lock.json" .test-install/
(
    cd .test-install
    npm ci "${quiet[@]}"
    # --no-save: the SDK pins stay exactly as their lock says; the tarball joins them.
    npm install --no-save "${quiet[@]}" "../.pack/$tarball"
    cp -r ../examples ../test .
    node --input-type=module -e '
        const url = import.meta.resolve("promptd-client");
        if (!url.includes("/.test-install/node_modules/promptd-client/")) {
            console.error(`promptd-client resolves to ${url}, not the installed tarball`);
            process.exit(1);
        }
        const { Client } = await import("promptd-client");
        if (typeof Client !== "function") process.exit(1);
        console.log(`promptd-client installed from .pack/'"$tarball"' (${url})`);'
)
stamp_of > .test-install/.stamp
