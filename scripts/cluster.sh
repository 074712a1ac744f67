#!/usr/bin/env bash
# Starts or stops a local 3-node conch cluster on 127.0.0.1:7001-7003.
#   scripts/cluster.sh start DIR          data, logs and pids under DIR
#   scripts/cluster.sh start-secure DIR   the same with TLS, client certificates, peer mutual
#                                         TLS and access control; certificates and the admin
#                                         token made under DIR/certs if absent
#   scripts/cluster.sh stop DIR           stops exactly the processes recorded in DIR/pids
# CONCH_CLUSTER_PORT sets the first port (default 7001; the nodes take it and the next two).
# CONCH_METRICS_PORT sets the first Prometheus metrics port (default 7101; 0: any free port).
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
port() { echo $((base + $1 - 1)); }
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
      --metrics-listen "127.0.0.1:$(mport "$id")" --initial-cluster "$members" ${extra[@]+"${extra[@]}"} >>"$dir/node$id.log" 2>&1 &
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
  if [ ! -s "$dir/pids" ]; then
    echo "cluster: nothing recorded in $dir/pids"
    exit 0
  fi
  for pid in $(cat "$dir/pids"); do
    # Only signal processes that are still the conchd we started.
    if [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "conchd" ]; then
      kill -TERM "$pid"
    fi
  done
  for pid in $(cat "$dir/pids"); do
    for _ in $(seq 50); do
      [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "conchd" ] || break
      sleep 0.1
    done
  done
  rm -f "$dir/pids"
  echo "cluster: stopped (data kept in $dir)"
  ;;
*)
  echo "usage: $0 start|start-secure|stop [DIR]" >&2
  exit 64
  ;;
esac
