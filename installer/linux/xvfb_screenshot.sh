#!/usr/bin/env bash
# Start an unpacked bundle's Studio on a virtual screen, time it to a visible main window, screenshot it.
#   installer/linux/xvfb_screenshot.sh BUNDLE_DIR OUT.png [SETTLE_SECONDS]
# Needs xvfb, xdotool and imagemagick (and Qt's xcb libraries: shared/PLATFORM.md). The Studio runs
# as a first-run user (an empty HOME) and is stopped afterwards; SETTLE_SECONDS (default 60) lets
# the embedded model load before the picture is taken.
set -euo pipefail
BUNDLE="$(cd "$1" && pwd)"
OUT="$2"
SETTLE="${3:-60}"
SCREEN=":$((90 + RANDOM % 100))"
HOME_DIR="$(mktemp -d)"
Xvfb "$SCREEN" -screen 0 1280x860x24 -nolisten tcp > /dev/null 2>&1 &
XVFB=$!
trap 'kill "${STUDIO:-}" 2> /dev/null || true; kill "$XVFB" 2> /dev/null || true; rm -rf "$HOME_DIR"' EXIT
sleep 1
start=$(date +%s.%N)
env -u WAYLAND_DISPLAY -u QT_QPA_PLATFORM DISPLAY="$SCREEN" HOME="$HOME_DIR" "$BUNDLE/paddock" > "$HOME_DIR/studio.log" 2>&1 &
STUDIO=$!
DISPLAY="$SCREEN" timeout 300 xdotool search --sync --onlyvisible --name "^Paddock Studio$" > /dev/null
echo "main window visible after $(echo "$(date +%s.%N) - $start" | bc) s"
sleep "$SETTLE"
DISPLAY="$SCREEN" import -window root "$OUT"
echo "screenshot: $OUT"
