"""`regbench report-bug`: one failing cell of a results folder as an issue in the sections of
vLLM's bug-report form, with a one-cell matrix that reproduces it (docs/diagnosis.md, "A bug report for upstream").

One package, one feature, in layers (pyproject.toml's import contracts):

    command             `regbench report-bug` and its arguments
    gather              the cell gathered from the folder (verdict, diagnosis, commands), redacted, written
    collect_env_docker  vLLM's collect_env in a container of the cell's image
    collect_env         vLLM's collect_env in the cell's environment here
    render              the Markdown issue: pure, no I/O
"""
