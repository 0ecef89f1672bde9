"""Exit codes, and the one error base the command line catches.

Every error regbench raises on purpose derives from RegbenchError and carries the exit code
the command ends with; `bench.cli.main` catches it once and prints its message. Anything else
that escapes is a bug and keeps its traceback.

    RegbenchError (2)
    ├── ConfigError           the matrix or a flag is wrong (bench.core.config)
    │   ├── HubError          a hub id that cannot be had (bench.weights.hub)
    │   └── ImageUnavailable  an image that cannot be pulled (bench.serve.images)
    ├── ResultsError          a results folder that cannot be read or continued (bench.store.results)
    │   ├── FolderBusy        another bench is writing it
    │   └── ResultsWriteError (3) a record could not be written: the run stopped
    ├── LauncherUnavailable   the launcher's back-end is not there
    │   └── DockerUnavailable no Docker engine answers (bench.serve.launch_docker)
    ├── SlurmError            sbatch/scontrol failed (bench.slurm)
    ├── LockFolderError       a device lock folder or file this user cannot open (bench.serve.slots)
    ├── VersionsError         a version map or bisect that cannot go on (bench.versions)
    ├── OverlayError          a loader release that cannot be installed (bench.weights.overlays)
    ├── NotACheckpoint        not a checkpoint folder (bench.weights.checkpoint)
    ├── AuditError, ReaderError an audit that could not run (bench.weights.audit)
    ├── HistoryError          the history database cannot be opened, migrated, read or written
    │                         (bench.history.store)
    └── TrendWriteError (3)   the trend page could not be written (bench.history.store)
"""

from __future__ import annotations

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_WRITE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class RegbenchError(Exception):
    """An error regbench reports to its user, and the exit code it ends with."""

    exit_code = EXIT_USAGE
    after = ""  # what the command line adds to the message: what became of the servers
