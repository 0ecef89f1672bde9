"""The run history: every finished run as rows of a database, read back as a cell's series, its
regressions and slowdowns, on the console and as a trend page (docs/history.md).

One package, one feature, in layers (pyproject.toml's import contracts):

    command   `regbench history` (ingest, show, trend) and its arguments
    store     the database (SQLAlchemy: SQLite, PostgreSQL), ingesting a results folder, the page
    table     the console tables         trend   the trend page (HTML, SVG)
    model     series, regressions and slowdowns across the stored runs: pure, no I/O
    rows      a judged run as history rows: pure, no I/O
"""
