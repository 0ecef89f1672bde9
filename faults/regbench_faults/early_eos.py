"""early_eos: EOS and stop token ids are allowed before `min_tokens` (vllm#15967). vLLM 0.32's
scheduler stops on them unconditionally (check_stop) and relies on MinTokensLogitsProcessor
masking them until min_tokens; the fault makes that processor take no request, so nothing is
masked. Patched in the engine core."""


def _no_mask(*args, **kwargs):
    return None


def patch(module):
    module.MinTokensLogitsProcessor.add_request = staticmethod(_no_mask)
    return "min_tokens no longer masks EOS or stop token ids"


PATCHES = {"vllm.v1.sample.logits_processor.builtin": patch}
