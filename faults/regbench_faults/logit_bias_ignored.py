"""logit_bias_ignored: a request's logit_bias is accepted and not applied, so a token banned with
-100 still comes (sampling parameters ignored, vllm#15241's family). vLLM 0.32 adds the biases in
LogitBiasLogitsProcessor.apply; the fault returns the logits untouched. Patched in the engine
core."""


def _untouched(self, logits):
    return logits


def patch(module):
    module.LogitBiasLogitsProcessor.apply = _untouched
    return "logit_bias is no longer added"


PATCHES = {"vllm.v1.sample.logits_processor.builtin": patch}
