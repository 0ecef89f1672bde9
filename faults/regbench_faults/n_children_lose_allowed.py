"""n_children_lose_allowed: with n > 1, every choice but the first loses the request's
allowed_token_ids (vllm#17975's family: n > 1 losing sampling parameters for all but one child;
PR #29313; n_children_lose_bad_words is its twin for bad_words). vLLM 0.32 makes each child of an
n > 1 request with ParentRequest.get_child_info(index), which copies the parent's
SamplingParams; the fault gives the children after the first a copy without the list, so they
sample from the whole vocabulary. Patched in the API server, where the children are made."""

from copy import copy


def _children_without_allowed(get_child_info):
    def get(self, index):
        request_id, params = get_child_info(self, index)
        if index == 0:
            return request_id, params
        params = copy(params)
        params.allowed_token_ids = None
        return request_id, params

    return get


def patch(module):
    parent = module.ParentRequest
    parent.get_child_info = _children_without_allowed(parent.get_child_info)
    return "the choices after the first of an n > 1 request lose their allowed_token_ids"


PATCHES = {"vllm.v1.engine.parallel_sampling": patch}
