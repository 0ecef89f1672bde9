"""regbench: an end-to-end serving regression bench for vLLM.

Data flow, one module each: config → matrix (cells) → launch → client (requests) → judge
(verdicts) → report, with runner as the one orchestrator and results as the files it writes.
"""
