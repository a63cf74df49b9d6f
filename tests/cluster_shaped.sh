#!/bin/sh
# Runs a command with the emulated cluster's links shaped to RATE, and unshapes them afterwards, whatever the
# command's fate:  cluster_shaped.sh RATE COMMAND ARGS...
script=$(dirname "$0")/../scripts/local-cluster.sh
rate=$1
shift
"$script" shape "$rate" || exit 1
trap '"$script" shape off >/dev/null' EXIT INT TERM
"$@"
