"""`ppmq bench`: ppmq side by side with peer brokers on named workloads.

Every system runs on this host with its data in a temporary directory, started
and stopped by the bench; its clients are Python processes of one shape for all
(one publisher, one process per subscriber), so the client overhead is shared
and the differences are the brokers'. See docs/performance.md for the figures.
"""
