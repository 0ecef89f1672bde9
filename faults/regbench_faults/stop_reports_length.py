"""stop_reports_length: a stop string hit ends the answer and cuts its text right, and the answer
says finish_reason `length` with no stop_reason, as if it had run to max_tokens (issue #46: a
fault of this kind was caught by nothing). vLLM 0.32's OutputProcessor sets finish_reason STOP
and the stop string as stop_reason where the detokenizer found one, then hands both to
RequestState.make_request_output; the fault swaps them there, for stop strings only (a stop
token id, EOS and max_tokens are left as they are). Patched in the API server."""


def _length_for_stop_strings(make_request_output, length):
    def make(self, new_token_ids, pooling_output, finish_reason, stop_reason, *args, **kwargs):
        if isinstance(stop_reason, str):
            finish_reason, stop_reason = length, None
        return make_request_output(self, new_token_ids, pooling_output, finish_reason, stop_reason, *args, **kwargs)

    return make


def patch(module):
    state = module.RequestState
    state.make_request_output = _length_for_stop_strings(state.make_request_output, module.FinishReason.LENGTH)
    return "a stop string ends an answer with finish_reason length"


PATCHES = {"vllm.v1.engine.output_processor": patch}
