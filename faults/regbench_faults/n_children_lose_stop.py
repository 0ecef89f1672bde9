"""n_children_lose_stop: with n > 1, every choice but the first loses the request's stop strings
and stop token ids (vllm#17975, #18767, #28861, #20580: n > 1 losing stop/bad_words/stop ids for
all but one child; PR #29313). vLLM 0.32 makes each child of an n > 1 request with
ParentRequest.get_child_info(index), which copies the parent's SamplingParams; the fault gives the
children after the first a copy without them. Patched in the API server, where the children are
made and where their detokenizers look for the stop strings."""

from copy import copy


def _children_without_stops(get_child_info):
    def get(self, index):
        request_id, params = get_child_info(self, index)
        if index == 0:
            return request_id, params
        params = copy(params)
        # EOS stays among the ids that end an answer: only the request's own stops are lost.
        params._all_stop_token_ids = set(params._all_stop_token_ids) - set(params.stop_token_ids or [])
        params.stop, params.stop_token_ids, params.output_text_buffer_length = [], [], 0
        return request_id, params

    return get


def patch(module):
    parent = module.ParentRequest
    parent.get_child_info = _children_without_stops(parent.get_child_info)
    return "the choices after the first of an n > 1 request lose their stop strings and stop token ids"


PATCHES = {"vllm.v1.engine.parallel_sampling": patch}
