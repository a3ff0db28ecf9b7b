#!/usr/bin/env bash
# Create or refresh .venv with plugmq, its extras and the example plugin; check Java for Spark.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "plugmq needs Python >= 3.11; $PYTHON is $("$PYTHON" --version 2>&1). Set PYTHON=/path/to/python3.11" >&2
    exit 1
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[spark,serve,test]" -e examples/plugmq-audit 2>&1 \
    | grep -v -E "^WARNING: (Location|The index url)" || true
.venv/bin/python -c "import plugmq, pyspark" || { echo "plugmq did not install into .venv" >&2; exit 1; }
if ! command -v java >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "Java not found: installing openjdk-17-jre-headless for Spark" >&2
        apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null
    else
        echo "WARNING: Java 17 is not installed; the Spark comparisons (plugmq compare, Spark tests) need it." \
             "Install a JRE 17 (e.g. apt-get install openjdk-17-jre-headless)." >&2
    fi
fi
