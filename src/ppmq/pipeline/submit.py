"""`ppmq report` for spark-submit, which runs a script file rather than a module:

    spark-submit [--master URL] [--conf ...] $(python -c 'import ppmq.pipeline.submit as s; print(s.__file__)') \
        --out OUT JOURNAL_PATH...

Master and configuration come from spark-submit. The report uses Spark's own
SQL functions only, so executors need no ppmq; the driver needs ppmq with the
`spark` extra (in client mode: on the submitting host).
"""

from __future__ import annotations

import argparse
import sys

from pyspark.sql import SparkSession

from ppmq.pipeline.inputs import without_journals
from ppmq.pipeline.report import report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ppmq-report", description="Journals of many ppmq hosts -> Parquet tables and report.html")
    ap.add_argument(
        "paths", nargs="+", metavar="JOURNAL_PATH", help="journal files or directories (searched recursively), any URI Spark reads"
    )
    ap.add_argument("--out", required=True, help="output directory (any URI Spark writes)")
    args = ap.parse_args(argv)
    if problems := without_journals(args.paths):
        print(f"ppmq-report: {'; '.join(problems)}", file=sys.stderr)
        return 1
    spark = SparkSession.builder.appName("ppmq report").getOrCreate()
    summary = report(spark, args.paths, args.out)
    print(summary.line(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
