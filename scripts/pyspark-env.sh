#!/usr/bin/env bash
# Creates the virtualenv of the PySpark tests (java/nodekernel-spark/pyspark,
# the test command's heavy tier) for one Spark line, with Spark as a user
# gets it (docs/spark.md, "Which jar goes with which Spark"); pinned in the
# requirements files of java/nodekernel-spark/pyspark:
#   3.5_2.12  .venv-pyspark: the `pyspark` wheel from PyPI, with the Spark it
#             bundles (3.5, Scala 2.12: what `pip install pyspark==3.5.*`
#             gives a user), and pytest (requirements.txt); the default
#   4.0_2.13  .venv-pyspark-4.0: the pyspark 4.0 wheel (Spark 4.0 is Scala
#             2.13 only; requirements-4.0.txt)
#   3.5_2.13  .venv-pyspark as for 3.5_2.12, and in it a SPARK_HOME of Spark
#             3.5 for Scala 2.13, .venv-pyspark/spark-3.5_2.13: no wheel
#             carries that Spark, and its distribution
#             (spark-3.5.x-bin-hadoop3-scala2.13) is on archive.apache.org
#             only. Its jars/ are Spark's _2.13 artifacts of the wheel's
#             version from Maven Central (java/spark-home/pom.xml), its bin/,
#             sbin/ and python/ (pyspark.zip for the executors' Python
#             workers) the wheel's.
# Virtualenvs of their own, not .venv: a wheel is 317 MB (3.5) or 430 MB
# (4.0) and only the heavy tier needs them. pip keeps the download in its
# cache (~/.cache/pip) and Maven the jars in ~/.m2, so a new venv installs
# without fetching them again; a stamp skips pip (and Maven) when the pins
# have not changed.
#   scripts/pyspark-env.sh [LINE]   prints the venv's python at the end
set -euo pipefail
cd "$(dirname "$0")/.."

line=${1:-3.5_2.12}
PY=${PYTHON:-python3}
REQ_DIR=java/nodekernel-spark/pyspark
case $line in
    3.5_2.12|3.5_2.13) VENV=.venv-pyspark REQ=$REQ_DIR/requirements.txt ;;
    4.0_2.13) VENV=.venv-pyspark-4.0 REQ=$REQ_DIR/requirements-4.0.txt ;;
    *) echo "pyspark-env: no Spark line '$line' (3.5_2.12, 3.5_2.13, 4.0_2.13)" >&2; exit 2 ;;
esac
STAMP=$VENV/.requirements.sha256
if ! command -v "$PY" >/dev/null 2>&1; then
    echo "pyspark-env: $PY not found; install CPython >= 3.9" >&2
    exit 1
fi
if [[ ! -x $VENV/bin/python ]]; then
    echo "== creating $VENV ==" >&2
    "$PY" -m venv "$VENV"
fi
if ! sha256sum --status -c "$STAMP" 2>/dev/null; then
    echo "== installing $REQ into $VENV ==" >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQ"
    sha256sum "$REQ" >"$STAMP"
fi
"$VENV/bin/python" -c 'import pyspark; print("pyspark", pyspark.__version__, pyspark.__file__)' >&2

# A SPARK_HOME laid out as a distribution's, for the line's Scala, from the
# wheel of the venv: the same Spark version, so that its Python and its JVM
# agree.
spark_home() {
    local home=$VENV/spark-$line scala=${line#*_} wheel version stamp
    wheel=$("$VENV/bin/python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')
    version=$("$VENV/bin/python" -c 'import pyspark; print(pyspark.__version__)')
    stamp="$(sha256sum java/spark-home/pom.xml "$STAMP" | sha256sum) $version $scala"
    if [[ -f $home/.stamp && $(<"$home/.stamp") == "$stamp" ]]; then
        echo "SPARK_HOME $home: Spark $version for Scala $scala" >&2
        return
    fi
    source scripts/lib/system-deps.sh
    ensure_tools "the Spark $line SPARK_HOME (java/spark-home)" mvn=maven >&2
    echo "== $home: Spark $version's _$scala jars (Maven), the wheel's scripts and Python ==" >&2
    rm -rf "$home" "$home.tmp"
    mkdir -p "$home.tmp"
    # -ntp: no download progress lines; the first run fetches the jars
    # from Maven Central into ~/.m2.
    mvn -B -ntp -q -Dstyle.color=never -f java/spark-home/pom.xml \
        -Dspark.version="$version" -Dscala.binary.version="$scala" \
        dependency:copy-dependencies -DoutputDirectory="$PWD/$home.tmp/jars" >&2
    [[ -f $home.tmp/jars/spark-core_$scala-$version.jar ]] ||
        { echo "pyspark-env: no spark-core_$scala-$version.jar in $home.tmp/jars" >&2; exit 1; }
    cp -r "$wheel/bin" "$wheel/sbin" "$wheel/python" "$home.tmp/"
    echo "$stamp" >"$home.tmp/.stamp"
    mv "$home.tmp" "$home"
    echo "SPARK_HOME $home: Spark $version for Scala $scala" >&2
}
if [[ $line == 3.5_2.13 ]]; then
    spark_home
fi
echo "$PWD/$VENV/bin/python"
