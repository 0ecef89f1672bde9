"""tool_calls_at_length: a streamed tool call cut by max_tokens ends with finish_reason `tool_calls`
instead of `length` (vllm#53269, in 0.27.0 to 0.30.0; the whole answer says `length`). Once a call
has streamed, OpenAIServingChat.chat_completion_stream_generator rewrote the end to `tool_calls`
whatever the engine said; 0.31.0 added `and output.finish_reason == "stop"`. The fault takes that
condition out of the method's source again and recompiles it. Patched in the API server; acts on
servers with a tool-call parser (`--enable-auto-tool-choice`)."""

import inspect
import textwrap

FIXED = 'and not tool_choice_function_name\n    and output.finish_reason == "stop"\n'
AS_IN_0_30 = "and not tool_choice_function_name\n"
RECOMPILED = "regbench_recompiled"  # stream_usage_one_choice marks its methods alike


def patch(module):
    cls = module.OpenAIServingChat
    method = cls.chat_completion_stream_generator
    if getattr(method, RECOMPILED, False):
        # Its source is the file's, which would silently undo the other fault's edit.
        raise RuntimeError("chat_completion_stream_generator was recompiled by another fault: arm them apart")
    source = textwrap.dedent(inspect.getsource(method))
    # The condition's lines, whatever their indentation: compared without it.
    lines = source.splitlines(keepends=True)
    flat = [line.strip() + "\n" for line in lines]
    want = FIXED.splitlines(keepends=True)
    at = next(i for i in range(len(flat)) if [x.strip() + "\n" for x in want] == flat[i:i + len(want)])
    del lines[at + 1]  # the `output.finish_reason == "stop"` line
    code = compile("".join(lines), inspect.getsourcefile(method), "exec")
    namespace: dict = {}
    exec(code, module.__dict__, namespace)  # vLLM's own source, one condition less
    setattr(namespace[method.__name__], RECOMPILED, True)
    cls.chat_completion_stream_generator = namespace[method.__name__]
    return "a streamed tool call cut by max_tokens ends with finish_reason tool_calls"


PATCHES = {"vllm.entrypoints.openai.chat_completion.serving": patch}
