"""The Spark side of ppmq: fleet reports from delivery journals, and a `ppmq` data
source that reads a store's snapshot and publishes a DataFrame's rows.

Needs the `spark` extra (`pip install 'ppmq[spark]'`): pyspark, pyarrow, matplotlib.
"""
