"""n_children_lose_bad_words: with n > 1, every choice but the first loses the request's
bad_words (vllm#17975, #18767: n > 1 losing bad_words for all but one child; PR #29313). vLLM
0.32 makes each child of an n > 1 request with ParentRequest.get_child_info(index), which copies
the parent's SamplingParams, the bad words already tokenized; the fault gives the children
after the first a copy without them. Patched in the API server, where the children are made."""

from copy import copy


def _children_without_bad_words(get_child_info):
    def get(self, index):
        request_id, params = get_child_info(self, index)
        if index == 0:
            return request_id, params
        params = copy(params)
        params.bad_words, params._bad_words_token_ids = None, None
        return request_id, params

    return get


def patch(module):
    parent = module.ParentRequest
    parent.get_child_info = _children_without_bad_words(parent.get_child_info)
    return "the choices after the first of an n > 1 request lose their bad_words"


PATCHES = {"vllm.v1.engine.parallel_sampling": patch}
