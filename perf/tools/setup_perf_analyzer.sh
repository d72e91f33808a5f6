#!/usr/bin/env bash
# Installs NVIDIA's perf_analyzer (PyPI `perf-analyzer`) under perf/.glibc/ (git-ignored), runnable on Debian 12.
#
# The wheel's binary needs glibc 2.38 and GLIBCXX_3.4.32; Debian 12 has glibc 2.36 and gcc 12's libstdc++. So, where
# the system's glibc is older, the loader, libc, libstdc++ and libgcc_s of Debian 13 (trixie) packages are unpacked
# next to it (apt-get download with a private sources list, lists and cache; dpkg -x), and perf/tools/perf_analyzer
# runs the binary through that loader (`ld-linux-x86-64.so.2 --library-path DIR perf_analyzer ...`). Nothing of the
# system is replaced or configured; no root-owned path is written.
#
# pip filters the wheel out on glibc 2.36 (its tag is manylinux_2_38) and would install the 0.1.0 placeholder of
# the same name instead, so the wheel is fetched by explicit platform and unpacked here rather than pip-installed.
#
#     bash perf/tools/setup_perf_analyzer.sh [PYTHON]     # PYTHON: a python with pip (default .venv/bin/python)
# Idempotent: a second run with the same versions does nothing (perf/.glibc/COMPLETE records them).
set -euo pipefail

PA_VERSION=${PA_VERSION:-2.60.0}
SUITE=${GLIBC_SUITE:-trixie}
PACKAGES=(libc6 libstdc++6 libgcc-s1)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${1:-$ROOT/.venv/bin/python}
DEST=$ROOT/perf/.glibc
STAMP="perf_analyzer=$PA_VERSION suite=$SUITE"

die() { echo "setup_perf_analyzer: $*" >&2; exit 1; }

if [[ -f $DEST/COMPLETE && $(cat "$DEST/COMPLETE") == "$STAMP"* ]]; then
    echo "perf_analyzer $PA_VERSION already set up in $DEST"
    exit 0
fi
[[ $(uname -m) == x86_64 ]] || die "only x86_64 is supported (the wheel is manylinux x86_64), this is $(uname -m)"
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON has no pip: run 'make setup' first or pass a python"
rm -rf "$DEST.tmp"
mkdir -p "$DEST.tmp/wheel"

# 1. The wheel, by its platform tag (no dependencies: it is one static-ish binary plus a tiny launcher).
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_38_x86_64 \
    --python-version 3 -d "$DEST.tmp/dl" "perf-analyzer==$PA_VERSION" 2>&1 | grep -v "^WARNING: Location" || true
WHEEL=$(ls "$DEST.tmp"/dl/perf_analyzer-"$PA_VERSION"-*.whl 2>/dev/null | head -1)
[[ -n $WHEEL ]] || die "pip could not download perf-analyzer==$PA_VERSION (manylinux_2_38_x86_64)"
"$PYTHON" -m zipfile -e "$WHEEL" "$DEST.tmp/wheel"
chmod +x "$DEST.tmp/wheel/perf_analyzer/bin/perf_analyzer"
rm -rf "$DEST.tmp/dl"

# 2. A newer glibc beside it, only where the system's is too old.
glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
if printf '2.38\n%s\n' "$glibc" | sort -V -C; then
    echo "system glibc $glibc >= 2.38: perf_analyzer runs as it is"
else
    command -v apt-get >/dev/null && command -v dpkg >/dev/null \
        || die "glibc $glibc < 2.38 and no apt-get/dpkg here: install perf_analyzer another way (e.g. NVIDIA's SDK container)"
    # The system's own mirror (first non-security URI of its sources), so no host is hard-coded here.
    mirror=$(awk 'BEGIN{RS=""} /Suites:/ && !/security/ {for (i=1;i<=NF;i++) if ($i=="URIs:") {print $(i+1); exit}}' \
        /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
    [[ -n $mirror ]] || mirror=$(awk '$1=="deb" && $0 !~ /security/ {for (i=2;i<=NF;i++) if ($i ~ /:\/\//) {print $i; exit}}' \
        /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | head -1 || true)
    [[ -n $mirror ]] || die "no Debian mirror found in /etc/apt/sources.list{,.d/}"
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    [[ -f $keyring ]] || die "$keyring missing: apt-get install debian-archive-keyring"
    apt_dir=$DEST.tmp/apt
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$DEST.tmp/debs"
    echo "deb [signed-by=$keyring] $mirror $SUITE main" > "$apt_dir/sources.list"
    apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o "Dir::Etc::SourceParts=-"
              -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
              -o "Dir::State::status=/dev/null" -o "APT::Architectures=amd64" -o "Acquire::Languages=none"
              -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
    apt-get -q "${apt_opts[@]}" update >/dev/null || die "apt-get update of $SUITE from $mirror failed"
    (cd "$DEST.tmp/debs" && apt-get -q "${apt_opts[@]}" download "${PACKAGES[@]}" >/dev/null) \
        || die "apt-get download ${PACKAGES[*]} ($SUITE) failed"
    for deb in "$DEST.tmp"/debs/*.deb; do dpkg -x "$deb" "$DEST.tmp/root"; done
    rm -rf "$apt_dir"  # the lists are ~60 MB; the .debs stay as the record of what was unpacked
    lib=$DEST.tmp/root/usr/lib/x86_64-linux-gnu
    [[ -x $lib/ld-linux-x86-64.so.2 && -f $lib/libstdc++.so.6 ]] || die "unpacked packages lack the loader or libstdc++"
fi

rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"
"$ROOT/perf/tools/perf_analyzer" --version >/dev/null 2>&1 \
    || "$ROOT/perf/tools/perf_analyzer" --help >/dev/null 2>&1 \
    || die "the installed perf_analyzer does not start: run perf/tools/perf_analyzer --help to see why"
echo "$STAMP glibc=$(ls "$DEST"/debs 2>/dev/null | tr '\n' ' ')" > "$DEST/COMPLETE"
echo "perf_analyzer $PA_VERSION ready: perf/tools/perf_analyzer"
