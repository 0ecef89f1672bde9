"""The subcommands of `regbench`, one module each: `add_cli_args(sub)` adds its parser (and sets
`main` as what runs it), `main(args)` maps the arguments to the stage that does the work and the
outcome to an exit code (bench.core.errors)."""
