#!/usr/bin/env bash
# Install Paddock Studio for the current user (no root): the program to ~/.local/lib/paddock-studio,
# `paddock` on ~/.local/bin, the application-menu entry and its icon under ~/.local/share.
#   ./install.sh              install (or update) from this unpacked folder
#   ./install.sh --uninstall  remove the program and the menu entry; models, settings and
#                             conversations stay (~/.local/share/paddock-studio, ~/.config/paddock-studio)
# PADDOCK_PREFIX and XDG_DATA_HOME move the program and the menu entry elsewhere.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PREFIX="${PADDOCK_PREFIX:-$HOME/.local/lib/paddock-studio}"
BIN="$HOME/.local/bin"

if [ "${1:-}" = "--uninstall" ]; then
  if [ -x "$PREFIX/paddock" ]; then "$PREFIX/paddock" install-desktop --uninstall; fi
  if [ -L "$BIN/paddock" ] && [ "$(readlink "$BIN/paddock")" = "$PREFIX/paddock" ]; then rm -f "$BIN/paddock"; fi
  rm -rf "$PREFIX"
  echo "Paddock Studio removed; your models, settings and conversations are kept."
  exit 0
fi
[ -x "$HERE/paddock" ] || { echo "install.sh: run it from the unpacked PaddockStudio folder" >&2; exit 1; }

if [ "$HERE" != "$PREFIX" ]; then
  rm -rf "$PREFIX.new"
  mkdir -p "$(dirname "$PREFIX")"
  cp -a "$HERE" "$PREFIX.new"
  chmod -R u+w "$PREFIX.new"  # an archive unpacked read-only must still be removable by --uninstall
  rm -rf "$PREFIX"
  mv "$PREFIX.new" "$PREFIX"
fi
mkdir -p "$BIN"
ln -sfn "$PREFIX/paddock" "$BIN/paddock"
"$PREFIX/paddock" install-desktop  # the .desktop entry (Exec: this program) and the icons
echo "Paddock Studio is installed: find it in the application menu, or run $BIN/paddock"
case ":$PATH:" in *":$BIN:"*) ;; *) echo "(add $BIN to PATH to type 'paddock' in a terminal)";; esac
