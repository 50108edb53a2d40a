#!/usr/bin/env bash
# Builds and runs tests/consumer/project against tandem found by find_package.
#   run_consumer.sh build-tree  BUILD_DIR WORK_DIR   (tandem_DIR = the build tree)
#   run_consumer.sh install     BUILD_DIR WORK_DIR   (installs to WORK_DIR/prefix first)
# The consumer sets its own config key (--set app.width=7) and must refuse a misspelt one. After
# an install, libtandem.so must name no CUDA library, and the consumer also runs where the CUDA
# toolkit's directories are empty (a mount namespace of an unprivileged user, `unshare -rm`), as on
# a machine without CUDA: with a CPU libtorch no CUDA library may load then (with the CUDA wheel,
# libtorch itself loads the wheel's CUDA runtime). Where such namespaces are not allowed, that
# part is reported as skipped.
set -euo pipefail
mode=$1 build=$2 work=$3
src=$(cd "$(dirname "$0")/project" && pwd)
rm -rf "$work" && mkdir -p "$work"
case "$mode" in
  build-tree) hint=(-Dtandem_DIR="$build") ;;
  install)
    cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
    hint=(-DCMAKE_PREFIX_PATH="$work/prefix") ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${hint[@]}" > "$work/configure.log"
cmake --build "$work/build" > "$work/build.log"
consumer=(env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT "$work/build/consumer")

out=$("${consumer[@]}" --set app.width=7)
echo "$out"
grep -q "app.width 7," <<<"$out" || { echo "run_consumer: --set app.width=7 was not applied" >&2; exit 1; }
status=0
err=$("${consumer[@]}" --set app.widht=7 2>&1) || status=$?
[ "$status" -eq 2 ] && grep -q "app.width" <<<"$err" ||
  { echo "run_consumer: a misspelt app key gave exit $status: $err" >&2; exit 1; }

if [ "$mode" = install ]; then
  lib=$(ls "$work"/prefix/lib*/libtandem.so.? | head -1)
  if readelf -d "$lib" | grep -E "NEEDED.*(libcudart|libnccl|libcuda\.|libtorch_cuda|libc10_cuda)"; then
    echo "run_consumer: $lib needs a CUDA library" >&2; exit 1
  fi
  # A CUDA build of libtorch (the default torch wheel) loads the CUDA runtime itself; only with a
  # CPU libtorch must no CUDA library be loaded at all.
  torch_cpu=$(ldd "$work/build/consumer" | awk '/libtorch_cpu/ {print $3}')
  expect_loaded=no
  if readelf -d "$torch_cpu" | grep -q "NEEDED.*libcudart"; then expect_loaded=yes; fi
  # Empty every directory of the CUDA toolkit that holds the CUDA runtime or NCCL (ld.so.cache
  # still names them), as on a machine without the toolkit.
  cuda_dirs=$(ldconfig -p | grep -E "libcudart|libnccl" | sed 's/.*=> //' | xargs -r -n1 dirname |
              xargs -r -n1 readlink -f | sort -u | tr '\n' ' ')
  if [ -z "$cuda_dirs" ]; then
    echo "run_consumer: no CUDA toolkit on this machine: the run above was without it"
  elif unshare -rm true 2>/dev/null; then
    hidden=$(unshare -rm sh -c 'for d in $1; do mount -t tmpfs none "$d" || exit 1; done; shift; "$@"' \
             sh "$cuda_dirs" "${consumer[@]}" --set app.width=7)
    echo "without $cuda_dirs: $hidden"
    grep -q "consumer: ok .*CUDA devices 0, CUDA libraries loaded: $expect_loaded" <<<"$hidden" ||
      { echo "run_consumer: the consumer did not run without the CUDA toolkit" \
             "(expected CUDA libraries loaded: $expect_loaded, by libtorch only)" >&2; exit 1; }
  else
    echo "run_consumer: skipped the run without the CUDA toolkit (unshare -rm is not allowed here)"
  fi
fi
echo "run_consumer: passed"
