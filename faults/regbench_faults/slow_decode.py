"""slow_decode: every model step takes longer (a performance regression: same output, slower).
REGBENCH_FAULT_SLOW_MS (default 30) is added to each GPUModelRunner.execute_model call that
schedules tokens (the CPU runner inherits it), in the engine core; a 128-token answer is ~128
such steps, nearly all of them decode steps."""

import os
import time


def patch(module):
    delay = float(os.environ.get("REGBENCH_FAULT_SLOW_MS", "30")) / 1000
    original = module.GPUModelRunner.execute_model

    def execute_model(self, scheduler_output, *args, **kwargs):
        if scheduler_output.total_num_scheduled_tokens:
            time.sleep(delay)
        return original(self, scheduler_output, *args, **kwargs)

    module.GPUModelRunner.execute_model = execute_model
    return f"+{delay * 1000:g} ms per model step"


PATCHES = {"vllm.v1.worker.gpu_model_runner": patch}
