"""batch_corrupt: output depends on what else is in the batch (vllm#27034). When a step computes
logits for more than one sequence, each sequence gets its neighbour's row (an indexing slip that
a batch of one cannot show). Patched at LogitsProcessor.forward, in the engine core."""


def patch(module):
    original = module.LogitsProcessor.forward

    def forward(self, *args, **kwargs):
        logits = original(self, *args, **kwargs)
        if logits is not None and logits.dim() == 2 and logits.shape[0] > 1:
            logits = logits.roll(1, dims=0)
        return logits

    module.LogitsProcessor.forward = forward
    return "logits rows rotated when a step holds more than one sequence"


PATCHES = {"vllm.model_executor.layers.logits_processor": patch}
