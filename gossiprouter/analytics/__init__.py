"""Analysis of load-test runs on Apache Spark: the delivery audit, latency and throughput report."""
