#!/usr/bin/env bash
# Starts or stops a local 3-node conch cluster on 127.0.0.1:7001-7003.
#   scripts/cluster.sh start DIR          data, logs and pids under DIR
#   scripts/cluster.sh start-secure DIR   the same with TLS, client certificates, peer mutual
#                                         TLS and access control; certificates and the admin
#                                         token made under DIR/certs if absent
#   scripts/cluster.sh stop DIR           stops the nodes serving DIR/node1-3: those recorded in
#                                         DIR/pids and any restarted there by hand (found by the
#                                         pid each node writes into DIR/nodeN/LOCK)
# CONCH_CLUSTER_PORT sets the first port (default 7001; the nodes take it and the next two).
# CONCH_METRICS_PORT sets the first Prometheus metrics port (default 7101; 0: any free port).
# CONCH_UI_PORT sets the first status page port (default 7201; off: no status page).
set -euo pipefail
cmd=${1:-}
dir=${2:-$(pwd)/.cluster}
bin=${CONCHD_BIN:-$(cd "$(dirname "$0")/.." && pwd)/target/release/conchd}
conch=${CONCH_BIN:-$(dirname "$bin")/conch}
base=${CONCH_CLUSTER_PORT:-7001}
case "$base" in
'' | *[!0-9]*) echo "cluster: CONCH_CLUSTER_PORT must be a port number, not '$base'" >&2; exit 64 ;;
esac
mbase=${CONCH_METRICS_PORT:-7101}
case "$mbase" in
'' | *[!0-9]*) echo "cluster: CONCH_METRICS_PORT must be a port number, not '$mbase'" >&2; exit 64 ;;
esac
ubase=${CONCH_UI_PORT:-7201}
case "$ubase" in
off) ;;
'' | *[!0-9]*) echo "cluster: CONCH_UI_PORT must be a port number or off, not '$ubase'" >&2; exit 64 ;;
esac
port() { echo $((base + $1 - 1)); }
ui() { if [ "$ubase" = off ]; then echo off; else echo "127.0.0.1:$((ubase + $1 - 1))"; fi; }
mport() { if [ "$mbase" = 0 ]; then echo 0; else echo $((mbase + $1 - 1)); fi; }
members="1=127.0.0.1:$(port 1),2=127.0.0.1:$(port 2),3=127.0.0.1:$(port 3)"
endpoints="127.0.0.1:$(port 1),127.0.0.1:$(port 2),127.0.0.1:$(port 3)"

if [ "$cmd" = start-secure ]; then
  certs="$dir/certs"
  if [ ! -s "$certs/ca.crt" ]; then
    "$conch" certs init "$certs" >/dev/null
  fi
  for id in 1 2 3; do
    [ -s "$certs/node$id.crt" ] || "$conch" certs node "$certs" --id "$id" --host 127.0.0.1 --host localhost >/dev/null
  done
  [ -s "$certs/client-admin.crt" ] || "$conch" certs client "$certs" --name admin >/dev/null
  if [ ! -s "$certs/admin.token" ]; then
    (umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$certs/admin.token")
  fi
fi

case "$cmd" in
start | start-secure)
  mkdir -p "$dir"
  if [ -s "$dir/pids" ]; then
    echo "cluster: $dir/pids exists; run 'make cluster-stop' first" >&2
    exit 1
  fi
  for id in 1 2 3; do
    extra=()
    if [ "$cmd" = start-secure ]; then
      extra=(--tls-cert "$certs/node$id.crt" --tls-key "$certs/node$id.key"
        --client-ca "$certs/ca.crt" --peer-ca "$certs/ca.crt")
      [ -s "$certs/ca.crl" ] && extra+=(--peer-crl "$certs/ca.crl")
      extra+=(--bootstrap-admin-token-file "$certs/admin.token")
    fi
    "$bin" --id "$id" --listen "127.0.0.1:$(port "$id")" --data-dir "$dir/node$id" \
      --metrics-listen "127.0.0.1:$(mport "$id")" --ui-listen "$(ui "$id")" --initial-cluster "$members" ${extra[@]+"${extra[@]}"} >>"$dir/node$id.log" 2>&1 &
    echo "$!" >>"$dir/pids"
  done
  sleep 0.3
  for pid in $(cat "$dir/pids"); do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "cluster: a node exited at start; see $dir/node*.log" >&2
      "$0" stop "$dir" || true
      exit 1
    fi
  done
  echo "cluster: 3 nodes on $endpoints"
  [ "$mbase" = 0 ] || echo "cluster: metrics on http://127.0.0.1:$(mport 1)/metrics (and $(mport 2), $(mport 3))"
  if [ "$ubase" != off ]; then
    scheme=http
    [ "$cmd" = start-secure ] && scheme=https
    echo "cluster: status page on $scheme://$(ui 1)/ui/ (and any other node's: $(ui 2), $(ui 3))"
  fi
  echo "cluster: data and logs in $dir"
  if [ "$cmd" = start-secure ]; then
    echo "cluster: TLS with client certificates, peer mutual TLS and access control; certificates and admin token in $certs"
    echo "cluster: try  export CONCH_ENDPOINTS=$endpoints"
    echo "              export CONCH_CACERT=$certs/ca.crt"
    echo "              export CONCH_CERT=$certs/client-admin.crt CONCH_KEY=$certs/client-admin.key"
    echo "              export CONCH_TOKEN_FILE=$certs/admin.token"
    echo "              $conch cluster status"
  else
    echo "cluster: try  CONCH_ENDPOINTS=$endpoints $conch cluster status"
  fi
  ;;
stop)
  # A live conchd (a zombie, exited but not yet reaped by its parent, is not).
  alive() {
    [ "$(cat /proc/"$1"/comm 2>/dev/null)" = "conchd" ] &&
      [ "$(awk '{print $3}' /proc/"$1"/stat 2>/dev/null)" != "Z" ]
  }
  # The conchd processes serving this cluster's data directories: those recorded at start,
  # and any started on DIR/nodeN since (a node restarted by hand).
  targets=()
  if [ -s "$dir/pids" ]; then
    for pid in $(cat "$dir/pids"); do
      if alive "$pid"; then
        targets+=("$pid")
      else
        echo "cluster: pid $pid (started by this script) was no longer running"
      fi
    done
  fi
  # A node writes its pid into DIR/nodeN/LOCK and keeps that file open (locked) while it runs,
  # however it was started (relative path, CONCH_DATA_DIR, a config file): the pid counts if
  # that process has the very file open, so a stale pid reused by another program does not.
  holds_lock() {
    local fd
    for fd in /proc/"$1"/fd/*; do
      [ "$(readlink "$fd" 2>/dev/null)" = "$2" ] && return 0
    done
    return 1
  }
  realdir=$(cd "$dir" 2>/dev/null && pwd -P || echo "$dir")
  for lock in "$realdir"/node[0-9]*/LOCK; do
    [ -s "$lock" ] || continue
    pid=$(tr -dc '0-9' <"$lock" 2>/dev/null | head -c 10)
    [ -n "$pid" ] || continue
    alive "$pid" || continue
    case " ${targets[*]-} " in *" $pid "*) continue ;; esac
    if holds_lock "$pid" "$lock"; then
      echo "cluster: pid $pid serves ${lock%/LOCK} but was started by hand; stopping it too"
      targets+=("$pid")
    fi
  done
  if [ "${#targets[@]}" = 0 ]; then
    rm -f "$dir/pids"
    echo "cluster: nothing of $dir was running"
    exit 0
  fi
  for pid in "${targets[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  left=()
  for pid in "${targets[@]}"; do
    for _ in $(seq 50); do
      alive "$pid" || break
      sleep 0.1
    done
    if alive "$pid"; then left+=("$pid"); fi
  done
  rm -f "$dir/pids"
  if [ "${#left[@]}" != 0 ]; then
    echo "cluster: pids ${left[*]} did not stop within 5 s (kill -9 them)" >&2
    exit 1
  fi
  echo "cluster: stopped ${#targets[@]} node(s) (data kept in $dir)"
  ;;
*)
  echo "usage: $0 start|start-secure|stop [DIR]" >&2
  exit 64
  ;;
esac
