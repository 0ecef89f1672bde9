"""Weights before servers: checkpoint headers (inspect), tensors streamed through the real loader
(audit, its reader) and the pre-flight that runs both before the cells; their report records
(model: pure) and console views (render: pure). A feature, but also a stage the runner calls (the
pre-flight): so its commands, `regbench inspect` and `regbench audit`, are with the others in
bench/commands, above the runner."""
