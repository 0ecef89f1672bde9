"""tool_args_dropped_streaming: a streamed tool call comes with its name and without its arguments
(vllm#47901); a non-streamed call is normal. vLLM 0.32's hermes tool parser makes a stream's
tool-call deltas in Hermes2ProToolParser.extract_tool_calls_streaming; the fault blanks the arguments
of every delta it returns. Patched in the API server, where the parser runs; acts only on servers
started with `--tool-call-parser hermes`."""


def patch(module):
    parser = module.Hermes2ProToolParser
    original = parser.extract_tool_calls_streaming

    def extract_tool_calls_streaming(self, *args, **kwargs):
        delta = original(self, *args, **kwargs)
        for call in getattr(delta, "tool_calls", None) or []:
            if call.function is not None:
                call.function.arguments = None
        return delta

    parser.extract_tool_calls_streaming = extract_tool_calls_streaming
    return "streamed tool calls lose their arguments"


PATCHES = {"vllm.tool_parsers.hermes_tool_parser": patch}
