"""stop_ignored: a request's stop strings are never found, so the answer runs on past them (a stop
string let through). vLLM 0.32's detokenizer looks for them with check_stop_strings, a module
function called by name; the fault makes it find none. Patched in the API server, where the
detokenizer runs."""


def _never(*args, **kwargs):
    return None


def patch(module):
    module.check_stop_strings = _never
    return "stop strings are never found"


PATCHES = {"vllm.v1.engine.detokenizer": patch}
