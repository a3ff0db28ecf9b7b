"""PySpark plugin comparisons: ``plugmq compare EXPERIMENTS --out DIR``.

An experiments file (:mod:`plugmq.spark.experiments`) names workloads, plugin sets and a matrix
of the two; every cell runs as one Spark task (:mod:`plugmq.spark.job`) that assembles a broker in
its own temporary directory and replays the workload (:mod:`plugmq.spark.replay`), on a virtual
clock for logic metrics and on the real clock for speed. Spark gathers the rows, aggregates them
with Spark SQL and writes Parquet tables and ``report.html`` (:mod:`plugmq.spark.report`).

Nothing here imports pyspark at module import time: ``plugmq compare`` loads it when it runs, and
the replay modules work without it (a Spark worker runs the same code as a local call).

Shipping the environment to a cluster: pack the virtualenv with venv-pack and let Spark unpack it
next to every executor, then point the workers' Python at it::

    pip install venv-pack
    venv-pack -p .venv -o plugmq-env.tar.gz
    PYSPARK_PYTHON=./environment/bin/python plugmq compare exp.toml --out out \\
        --master spark://host:7077 --conf spark.archives=plugmq-env.tar.gz#environment \\
        --conf spark.executorEnv.PYSPARK_PYTHON=./environment/bin/python

(``examples/compare/README.md`` has the details.)
"""

__all__: list[str] = []
