#!/usr/bin/env bash
# Browser test of kproxy's web view: installs what it needs (Debian's
# chromium, playwright-core from npm), builds the e2e server, and runs
# test.mjs. Fails loudly when chromium cannot be had. Screenshots land in
# tap/webview/e2e/artifacts/.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
chromium=${CHROMIUM:-/usr/bin/chromium}

if [ ! -x "$chromium" ]; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "e2e: installing Debian's chromium" >&2
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
	fi
fi
if [ ! -x "$chromium" ]; then
	echo "e2e: FATAL: chromium is missing at $chromium and could not be installed (apt-get install -y chromium as root)" >&2
	exit 1
fi
for tool in node npm go; do
	command -v "$tool" >/dev/null || { echo "e2e: FATAL: $tool is not installed" >&2; exit 1; }
done

cd "$here"
npm ci --no-audit --no-fund --loglevel=error

bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
(cd "$root" && go build -o "$bin/e2eserver" ./tap/internal/e2eserver)

CHROMIUM="$chromium" E2E_SERVER="$bin/e2eserver" node "$here/test.mjs"
