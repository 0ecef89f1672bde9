"""schema_dropped: a request's structured output (response_format json_schema, vLLM's
structured_outputs) is accepted and dropped, so free text comes back with HTTP 200 (vllm#53975:
legacy guided_json silently ignored). vLLM 0.32's engine core makes a request's grammar from
Request.structured_output_request; the fault builds each request without one. Patched in the
engine core."""


def patch(module):
    request = module.Request
    build = request.__init__

    def init_without_grammar(self, *args, **kwargs):
        build(self, *args, **kwargs)
        if self.structured_output_request is not None:
            self.structured_output_request = None
            # It waited for its grammar, which now never comes.
            self.status = module.RequestStatus.WAITING

    request.__init__ = init_without_grammar
    return "structured outputs are dropped from every request"


PATCHES = {"vllm.v1.request": patch}
