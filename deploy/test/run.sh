#!/usr/bin/env bash
# Tests of deploy/ (called by .ci/run after the cargo tests; runnable alone from anywhere):
#   static   promtool check config / check rules / test rules (alert unit tests), dashboard JSON
#            checks (+ every query parsed by promtool), Kubernetes manifests against the
#            Kubernetes schemas (offline) and prometheus-operator's CRD models, compose against
#            the Compose Spec schema, Dockerfiles through hadolint (no Docker engine here).
#   e2e      a real Prometheus with deploy/prometheus's config and rules scraping
#            - fake_pace.py, a stand-in serving the metric contract (always), and
#            - the real `pace serve` (skipped loudly while `pace serve --help` fails),
#            under a short bounded load; every dashboard and rule expression must return data;
#            panels rendered as PNGs into deploy/test/out/.
# Installs what it needs, idempotently: a venv with deploy/test/requirements.txt
# ($PACE_DEPLOY_VENV, default /tmp/deploy-venv) and Prometheus 2.42 + promtool extracted from
# Debian's package into $PACE_DEPLOY_CACHE (default /tmp/pace-deploy-cache; no service started).
# Or point PROMETHEUS and PROMTOOL at binaries you have. Extra arguments go to pytest, e.g.
#   deploy/test/run.sh -k static        PACE_CMD=target/release/pace deploy/test/run.sh -k real
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${PACE_DEPLOY_VENV:-/tmp/deploy-venv}
CACHE=${PACE_DEPLOY_CACHE:-/tmp/pace-deploy-cache}
REQ=deploy/test/requirements.txt
export PACE_DEPLOY_PIDFILE=${PACE_DEPLOY_PIDFILE:-$(mktemp -t pace-deploy-pids.XXXXXX)}

cleanup() {
  # Last resort: the tests stop what they start; this ends any process group they left behind.
  if [[ -s "$PACE_DEPLOY_PIDFILE" ]]; then
    while read -r pid; do kill -TERM -- "-$pid" 2>/dev/null || true; done < "$PACE_DEPLOY_PIDFILE"
    sleep 1
    while read -r pid; do kill -KILL -- "-$pid" 2>/dev/null || true; done < "$PACE_DEPLOY_PIDFILE"
  fi
  rm -f "$PACE_DEPLOY_PIDFILE"
}
trap cleanup EXIT INT TERM

# --- Python tools ------------------------------------------------------------------------------
want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [[ ! -x "$VENV/bin/python" || "$(cat "$VENV/.pace-requirements" 2>/dev/null)" != "$want" ]]; then
  echo "deploy/test: installing Python tools into $VENV"
  python3 -m venv "$VENV"
  timeout 600 "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ"
  echo "$want" > "$VENV/.pace-requirements"
fi

# --- Prometheus and promtool -----------------------------------------------------------------
if [[ -z "${PROMETHEUS:-}" || -z "${PROMTOOL:-}" ]]; then
  if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
    PROMETHEUS=$(command -v prometheus) PROMTOOL=$(command -v promtool)
  else
    if [[ ! -x "$CACHE/prometheus/usr/bin/promtool" ]]; then
      echo "deploy/test: fetching Debian's prometheus package into $CACHE"
      mkdir -p "$CACHE/deb"
      rm -f "$CACHE"/deb/prometheus_*.deb
      ( cd "$CACHE/deb" && { timeout 300 apt-get download prometheus 2>/dev/null \
          || { timeout 300 apt-get update -qq && timeout 300 apt-get download prometheus; }; } ) \
        || { echo "deploy/test: cannot get Debian's prometheus package; set PROMETHEUS and PROMTOOL" >&2; exit 1; }
      dpkg-deb -x "$CACHE"/deb/prometheus_*.deb "$CACHE/prometheus"
    fi
    PROMETHEUS=$CACHE/prometheus/usr/bin/prometheus PROMTOOL=$CACHE/prometheus/usr/bin/promtool
  fi
fi
export PROMETHEUS PROMTOOL PATH="$VENV/bin:$(dirname "$PROMTOOL"):$PATH"
echo "deploy/test: $("$PROMTOOL" --version 2>&1 | head -1)"

# --- the tests (bounded: every wait inside has its own timeout too) ----------------------------
timeout 1500 "$VENV/bin/python" -m pytest deploy/test -ra -p no:cacheprovider -p no:cloudcoil "$@"
