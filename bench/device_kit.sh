#!/bin/sh
# bench/device_kit.sh: the Debian libraries zplan builds against, for a machine that cannot
# install packages (the device tool's GPU machines reach no network).
#   here:  sh bench/device_kit.sh fetch .devkit    downloads the .debs (~30 MB; .devkit is
#          git-ignored: name it in the device tool's `carry`)
#   there: eval "$(sh bench/device_kit.sh env .devkit)"   unpacks them under .devkit/root once
#          and prints the exports that make gcc, mpicc, pkg-config and the loader use them.
# Enough to build everything and to run zreal as one process (--emulate N, including
# --emulate 1 for a plain single rank); mpirun from the kit is not made to work (its PMIx
# plugins are not relocated), so multi-rank runs need the machine's own Open MPI.
set -eu
PACKAGES="libglib2.0-dev libglib2.0-0 libpcre2-8-0 libpcre2-dev libjansson-dev libjansson4 \
libgsl-dev libgsl27 libgslcblas0 libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread \
libopenblas0 libgfortran5 libquadmath0 libopenmpi-dev libopenmpi3 openmpi-common openmpi-bin \
libhwloc15 libudev1 libevent-core-2.1-7 libevent-pthreads-2.1-7 pkgconf pkgconf-bin libpkgconf3 \
zlib1g-dev zlib1g"
usage() { echo "usage: sh bench/device_kit.sh fetch|env DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
dir=$2
case $1 in
fetch)
    mkdir -p "$dir"
    (cd "$dir" && apt-get download $PACKAGES >/dev/null)
    echo "device_kit: $(ls "$dir"/*.deb | wc -l) packages, $(du -sh "$dir" | cut -f1) in $dir" >&2
    ;;
env)
    root=$(cd "$dir" && pwd)/root
    if [ ! -d "$root" ]; then
        for deb in "$dir"/*.deb; do dpkg -x "$deb" "$root"; done
        # What the packages' maintainer scripts (update-alternatives) would have linked.
        mkdir -p "$root/kit-bin"
        ln -sf "$root/usr/bin/mpicc.openmpi" "$root/kit-bin/mpicc"
        ln -sf "$root/usr/bin/pkgconf" "$root/kit-bin/pkg-config"
    fi
    lib=$root/usr/lib/x86_64-linux-gnu
    libs=$lib:$lib/openblas-pthread
    echo "export PATH='$root/kit-bin:$root/usr/bin':\"\$PATH\""
    echo "export OPAL_PREFIX='$root/usr'"
    echo "export PKG_CONFIG_LIBDIR='$lib/pkgconfig:$root/usr/share/pkgconfig'"
    echo "export PKG_CONFIG_SYSROOT_DIR='$root'"
    echo "export LIBRARY_PATH='$libs'\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
    echo "export LD_LIBRARY_PATH='$libs'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
    ;;
*) usage ;;
esac
