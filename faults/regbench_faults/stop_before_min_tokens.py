"""stop_before_min_tokens: a stop string ends the answer even before min_tokens (vllm#21987, fixed
by PR #22014). vLLM 0.32's incremental detokenizer looks for stop strings only once the answer
holds more than min_tokens tokens, from the text of token min_tokens on; the fault makes each
detokenizer forget the request's min_tokens, as vLLM did before the fix. Patched in the API
server, where the detokenizer runs."""


def _forgetting_min_tokens(init):
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.min_tokens = 0

    return __init__


def patch(module):
    base = module.BaseIncrementalDetokenizer
    base.__init__ = _forgetting_min_tokens(base.__init__)
    return "stop strings end answers before min_tokens"


PATCHES = {"vllm.v1.engine.detokenizer": patch}
