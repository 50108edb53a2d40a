#!/usr/bin/env bash
# Builds and runs tests/consumer/project against tandem found by find_package.
#   run_consumer.sh build-tree  BUILD_DIR WORK_DIR   (tandem_DIR = the build tree)
#   run_consumer.sh install     BUILD_DIR WORK_DIR   (installs to WORK_DIR/prefix first)
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
env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT "$work/build/consumer"
