#!/bin/sh
# The cluster tests' fixture: "up" brings up this test run's emulated cluster (its name, t<ctest pid>h, comes from
# expect_run.cmake through HOPWISE_CLUSTER_PREFIX), first removing clusters of test runs that are gone;
# "down" removes it. Clusters of other runs still going are left alone.
set -e
script=$(dirname "$0")/../scripts/local-cluster.sh
case $1 in
  up)
    for dir in /run/hopwise-cluster/t*h; do
      [ -d "$dir" ] || continue
      name=${dir##*/}
      pid=${name#t}
      pid=${pid%h}
      case $pid in '' | *[!0-9]*) continue ;; esac
      [ "$name" != "$HOPWISE_CLUSTER_PREFIX" ] || continue
      kill -0 "$pid" 2>/dev/null || HOPWISE_CLUSTER_PREFIX=$name "$script" down
    done
    "$script" down >/dev/null
    exec "$script" up 4 --slots 2
    ;;
  down) exec "$script" down ;;
  *) echo "usage: cluster_fixture.sh up|down" >&2; exit 2 ;;
esac
