# Sourced by loadtest/sweep.sh and loadtest/cluster_bench.sh: start a local cluster on free
# ports and wait until the router is healthy. Needs ROOT, BUILD, THREADS, PYTHON set.
# Sets PORT (router gRPC), HTTP_PORT (its OpenAI HTTP API), METRICS_PORT (the router's /metrics;
# target +1, draft +2) and CLUSTER (launcher pid); the cluster stops when the script exits,
# or earlier with stop_cluster. scrape_router_metrics FILE saves the router's /metrics.

free_port() {
  "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

stop_cluster() {
  # shellcheck disable=SC2086  # ALSO_STOP is a list of pids
  kill -TERM "$CLUSTER" ${ALSO_STOP:-} 2>/dev/null || true
  # shellcheck disable=SC2086
  wait "$CLUSTER" ${ALSO_STOP:-} 2>/dev/null || true
  trap - EXIT
}

scrape_router_metrics() {  # the router's /metrics into $1 (loadtest/metrics_delta.py reads it)
  "$PYTHON" -c 'import sys, urllib.request as u; sys.stdout.write(u.urlopen(sys.argv[1], timeout=10).read().decode())' \
    "http://localhost:$METRICS_PORT/metrics" > "$1"
}

start_cluster() {  # name for messages
  PORT="$(free_port)"
  HTTP_PORT="${SPECD_HTTP_PORT-$(free_port)}"  # SPECD_HTTP_PORT= for binaries without HTTP
  METRICS_PORT="$(free_port)"  # the router's; the target's is +1, the draft's +2
  env ${CLUSTER_ENV[@]+"${CLUSTER_ENV[@]}"} "$ROOT/scripts/run_cluster.sh" --build "$BUILD" --threads "$THREADS" --port "$PORT" \
    --metrics-port "$METRICS_PORT" --http-port "$HTTP_PORT" &
  CLUSTER=$!
  trap stop_cluster EXIT
  for _ in $(seq 1 1200); do
    "$BUILD/tools/specd" client health --server "localhost:$PORT" --timeout 1 >/dev/null 2>&1 && return 0
    kill -0 "$CLUSTER" 2>/dev/null || { echo "$1: the cluster did not start" >&2; exit 1; }
    sleep 0.1
  done
  echo "$1: the cluster did not become healthy" >&2
  exit 1
}
