#!/usr/bin/env bash
# Create or refresh .venv with plugmq, its extras and the example plugin; check the system programs
# the tests start for real: Java 17 (Spark, ZooKeeper), Apache ZooKeeper (clusters), redis-server
# (the benchmarks' peer), Chromium and chromedriver (the console's browser tests), and ISA-L's
# library (store_mmap's hardware CRC-32). As root they are installed
# with apt; otherwise a clear warning names them.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "plugmq needs Python >= 3.11; $PYTHON is $("$PYTHON" --version 2>&1). Set PYTHON=/path/to/python3.11" >&2
    exit 1
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
PYTHONWARNINGS=ignore .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[spark,serve,cluster,bench,chaos,console,trace,test]" -e examples/plugmq-audit -e examples/plugmq-rendezvous -e examples/plugmq-glob 2>&1 \
    | grep -v -E "^WARNING: (Location|The index url)" || true
.venv/bin/python -c "import plugmq, pyspark, kazoo" || { echo "plugmq did not install into .venv" >&2; exit 1; }
# An editable install leaves plugmq's own modules uncompiled: compile them now (about half a second),
# so the first `plugmq serve` does not spend that CPU before it answers (nor every start where
# PYTHONDONTWRITEBYTECODE is set).
.venv/bin/python -m compileall -q -j 0 plugmq examples/plugmq-audit/src examples/plugmq-rendezvous/src examples/plugmq-glob/src >/dev/null

# Debian packages: command to look for -> package that provides it -> what needs it.
missing=()
command -v java >/dev/null 2>&1 || missing+=("openjdk-17-jre-headless:Java 17 (Spark comparisons, ZooKeeper)")
[ -f /usr/share/java/zookeeper.jar ] || missing+=("zookeeper:Apache ZooKeeper (cluster and replication tests)")
command -v redis-server >/dev/null 2>&1 || missing+=("redis-server:Redis (benchmark baseline)")
command -v chromium >/dev/null 2>&1 || missing+=("chromium:headless Chromium (the console's browser tests)")
command -v chromedriver >/dev/null 2>&1 || missing+=("chromium-driver:chromedriver (selenium drives Chromium in the console's browser tests)")
# ISA-L: the store's read kernel computes CRC-32 with it (PCLMUL), ~5x cheaper than zlib's; loaded at run time
/sbin/ldconfig -p 2>/dev/null | grep -q 'libisal\.so\.2 ' || missing+=("libisal2:ISA-L (hardware CRC-32 for store_mmap's read checks; zlib's is used without it)")
if [ ${#missing[@]} -gt 0 ]; then
    packages=("${missing[@]%%:*}")
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing with apt: ${packages[*]}" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null
    else
        for entry in "${missing[@]}"; do
            echo "WARNING: ${entry#*:} is not installed: apt-get install ${entry%%:*}" \
                 "(tests that need it are skipped with this reason)" >&2
        done
    fi
fi
