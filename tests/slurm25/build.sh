#!/usr/bin/env bash
# Builds the parts of Slurm 25.11 the integration tests run (libslurm and its headers,
# slurmctld, slurmd/slurmstepd, slurmdbd with the accounting_storage/mysql plugin, the
# clients (sacct, sacctmgr among them) and the plugins the test cluster's slurm.conf names)
# from the source tarball, and a pyslurm wheel against it; installs both under PREFIX.
# Skips what is already there, so a rerun costs nothing.
#
#   bash tests/slurm25/build.sh TARBALL [PREFIX]     # PREFIX defaults to /opt/slurm-25.11
#
# Needs gcc, make, libmunge-dev, libjson-c-dev, libmariadb-dev (tests/apt-packages.txt) and
# pip's index for pyslurm's sdist.
# --enable-multiple-slurmd lets several slurmd run on one host (slurmd -N nX), as the test
# cluster does. --disable-static: libtool would otherwise compile every file twice. JSON
# (json-c, serializer/json, data_parser v0.0.44) is what `sinfo --json` needs, as ingero's
# scontrol backend reads it. slurmdbd and accounting_storage/{slurmdbd,mysql} are what
# `sacct` reads a job's AdminComment back through (the sacct verdict's tests, MariaDB beside);
# slurmd of a cluster with accounting loads accounting_storage/ctld_relay.
# Only a subset of src/ is built: the whole tree (slurmrestd, every data_parser, sview, every
# plugin) takes several times as long and the tests use none of it.
set -euo pipefail
tarball=${1:?usage: build.sh TARBALL [PREFIX]}
prefix=${2:-/opt/slurm-25.11}
pyslurm_version=25.11.2
jobs=$(nproc)

# Directories of src/ in build order: libraries first, then what links against them.
core="common interfaces conmgr api bcast stepmgr database slurmctld slurmd slurmdbd
  scontrol sinfo squeue sbatch srun scancel sacct sacctmgr"
plugins="auth/munge cred/common cred/munge hash/common_xkcp hash/k12 proctrack/linuxproc
  sched/backfill select/cons_tres topology/common topology/flat prep/script priority/basic
  tls/none gres/common gres/gpu gpu/common gpu/generic serializer/json data_parser/v0.0.44
  mpi/pmi2 certgen/script certmgr/script accounting_storage/common accounting_storage/slurmdbd
  accounting_storage/ctld_relay accounting_storage/mysql"

# slurmdbd marks a complete install (a prefix built before it was added is built again).
if [ ! -x "$prefix/sbin/slurmdbd" ]; then
  work=$(mktemp -d /var/tmp/slurm25-build.XXXXXX)
  trap 'rm -rf "$work"' EXIT
  tar -C "$work" -xf "$tarball"
  src=$(echo "$work"/slurm-*)
  cd "$src"
  fail() { echo "slurm build: $1 failed; last lines of $2:" >&2; tail -25 "$2" >&2; exit 1; }
  ./configure --prefix="$prefix" --sysconfdir="$prefix/etc" --disable-debug --without-rpath \
    --disable-static --enable-multiple-slurmd --disable-slurmrestd --disable-sview --disable-x11 \
    --without-hdf5 --without-nvml --without-rsmi --without-oneapi --without-pmix \
    --without-freeipmi --without-ucx --without-rdkafka --without-s2n --without-bpf \
    --without-hwloc --without-lua --without-libcurl --without-jwt --without-yaml \
    --without-http-parser --without-ofed --without-lz4 --without-readline \
    >"$work/configure.log" 2>&1 || fail configure "$work/configure.log"
  for dir in $core; do
    make -j"$jobs" -C "src/$dir" >>"$work/make.log" 2>&1 || fail "make src/$dir" "$work/make.log"
  done
  for dir in $plugins; do
    make -j"$jobs" -C "src/plugins/$dir" >>"$work/make.log" 2>&1 \
      || fail "make src/plugins/$dir" "$work/make.log"
  done
  # Without MariaDB's client library configure leaves the mysql plugin out, silently.
  [ -e src/plugins/accounting_storage/mysql/.libs/accounting_storage_mysql.so ] \
    || fail "accounting_storage/mysql (is libmariadb-dev installed?)" "$work/configure.log"
  make install-pkgincludeHEADERS >>"$work/install.log" 2>&1 || fail "install headers" "$work/install.log"
  # slurmdbd last: its presence marks a complete install.
  for dir in $(echo "$core" | sed 's/slurmdbd//') $(printf 'plugins/%s ' $plugins) slurmdbd; do
    make -C "src/$dir" install >>"$work/install.log" 2>&1 || fail "install src/$dir" "$work/install.log"
  done
fi

wheel_dir="$prefix/wheels"
if ! ls "$wheel_dir"/pyslurm-"$pyslurm_version"-*.whl >/dev/null 2>&1; then
  mkdir -p "$wheel_dir"
  # PYSLURM_BUILD_JOBS: Cython translates the modules in parallel (one at a time otherwise).
  # -O1 -g0 (after Python's -O3 -g, so they win): the generated C is large, and a Slurm RPC,
  # not the wrapper's code, is what a call waits for.
  CFLAGS="${CFLAGS:-} -O1 -g0" PYSLURM_BUILD_JOBS=$jobs SLURM_INCLUDE_DIR="$prefix/include" SLURM_LIB_DIR="$prefix/lib" \
    python3 -m pip wheel -q --no-deps --no-cache-dir --no-binary pyslurm -w "$wheel_dir" \
    "pyslurm==$pyslurm_version"
fi
"$prefix/sbin/slurmctld" -V
