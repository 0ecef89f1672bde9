"""nan_logits: the model's logits are NaN (vllm#14126): greedy sampling then picks the same id at
every step (0 on CPU: vLLM's greedy_argmax returns the first index), HTTP 200 all the same.
Patched at LogitsProcessor.forward, in the engine core."""


def patch(module):
    original = module.LogitsProcessor.forward

    def forward(self, *args, **kwargs):
        logits = original(self, *args, **kwargs)
        if logits is not None:
            logits = logits.clone().fill_(float("nan"))
        return logits

    module.LogitsProcessor.forward = forward
    return "every logit NaN"


PATCHES = {"vllm.model_executor.layers.logits_processor": patch}
