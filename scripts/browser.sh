#!/usr/bin/env bash
# Debian's chromium for the console's browser tests (tests/console, marker `browser`), driven
# by Playwright's Python API with executable_path=/usr/bin/chromium. Idempotent: nothing to do
# when it is there. Never `playwright install`: no browser download from outside Debian.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium
