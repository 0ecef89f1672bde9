"""The pure core: the matrix schema and its cells, the records, the verdict taxonomy, the judge,
statistics and comparisons. No I/O: nothing here opens a socket or starts a process, and nothing
reads a file but the known-issue signatures shipped beside the package, which
bench.core.diagnosis.load_signatures parses as data (their folders are the caller's)."""
