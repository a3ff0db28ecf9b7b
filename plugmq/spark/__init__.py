"""PySpark plugin comparisons: ``plugmq compare EXPERIMENTS --out DIR``.

An experiments file (:mod:`plugmq.spark.experiments`) names workloads, plugin sets and a matrix
of the two; every cell runs as one Spark task (:mod:`plugmq.spark.job`) that assembles a broker in
its own temporary directory and replays the workload (:mod:`plugmq.spark.replay`), on a virtual
clock for logic metrics and on the real clock for speed; real-clock experiments share one serial
lane (:func:`plugmq.spark.job.plan_tasks`). Tasks report progress to the driver as they go
(:mod:`plugmq.spark.progress`). Spark gathers the rows, aggregates them
with Spark SQL and writes Parquet tables and ``report.html`` (:mod:`plugmq.spark.report`), which
opens with the headline table (:mod:`plugmq.spark.headline`). What each kind of matrix compares is
declared in :mod:`plugmq.spark.kinds`, the place to add a comparison dimension.

Nothing here imports pyspark at module import time: ``plugmq compare`` loads it when it runs, and
the replay modules work without it (a Spark worker runs the same code as a local call).

On a cluster (``--master spark://...``) the executors need plugmq and its dependencies: on one
machine they run the driver's virtualenv; elsewhere ship a packed virtualenv with
``spark.archives``. ``examples/compare/README.md`` has both recipes, and
:mod:`plugmq.spark.standalone` starts a standalone master and workers from the pip pyspark.
"""

__all__: list[str] = []
