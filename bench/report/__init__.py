"""Reports: the summary, the console table, Markdown, JUnit and the HTML page, rendered from
records. Pure: bench.store.publish reads and writes the files."""
