"""Weights before servers: checkpoint headers (inspect), tensors streamed through the real loader
(audit, its probe) and the pre-flight that runs both before the cells."""
