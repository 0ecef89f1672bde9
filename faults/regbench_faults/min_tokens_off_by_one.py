"""min_tokens_off_by_one: EOS and the stop token ids are held back for one token fewer than
`min_tokens` asks (the off-by-one of vllm#15967's family): an answer whose EOS comes as soon as
it may ends with min_tokens - 1 tokens before it. vLLM 0.32's scheduler stops on EOS whenever it
comes and relies on MinTokensLogitsProcessor to mask it until min_tokens; the fault registers
each request with its min_tokens less one. Patched in the engine core."""


def patch(module):
    processor = module.MinTokensLogitsProcessor
    register = processor.add_request  # a staticmethod: the plain function

    def add_request_one_short(params, prompt_ids, output_ids):
        entry = register(params, prompt_ids, output_ids)
        if entry is None:
            return None
        min_tokens, out, stop_ids, structured = entry
        return None if len(out) >= min_tokens - 1 else (min_tokens - 1, out, stop_ids, structured)

    processor.add_request = staticmethod(add_request_one_short)
    return "EOS and stop token ids held back one token short of min_tokens"


PATCHES = {"vllm.v1.sample.logits_processor.builtin": patch}
