"""empty_detokenize: the detokenizer hands out empty text while the token ids are the normal
ones (what a client sees of #38991-like failures: 128 tokens, no text). Patched at
BaseIncrementalDetokenizer.get_next_output_text, in the API server process."""


def _empty(self, finished, delta):
    return ""


def patch(module):
    module.BaseIncrementalDetokenizer.get_next_output_text = _empty
    return "every text delta and final text empty"


PATCHES = {"vllm.v1.engine.detokenizer": patch}
