"""The pure core: the matrix schema and its cells, the records, the verdict taxonomy, the judge,
statistics and comparisons. No I/O: nothing here opens a file, a socket or a process."""
