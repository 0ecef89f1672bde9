"""stream_usage_one_choice: a streamed answer's usage counts the tokens of its first choice only, so
an n > 1 stream reports fewer completion tokens than the ids it sent; an n = 1 stream and every
whole answer are counted right (the class of vllm#8625, wrong completion_tokens in streaming
usage). vLLM 0.32's streaming generators keep a count per choice (`previous_num_tokens`) and put
their sum into the final usage chunk; the fault makes that sum the first choice's count, in the
methods' own source, recompiled. Patched in the API server, for completions and chat."""

import inspect
import textwrap

SUM = "sum(previous_num_tokens)"
FIRST = "previous_num_tokens[0]"
RECOMPILED = "regbench_recompiled"  # tool_calls_at_length marks its method alike


def _first_choice_only(module, cls_name: str, method_name: str) -> None:
    cls = getattr(module, cls_name)
    method = getattr(cls, method_name)
    if getattr(method, RECOMPILED, False):
        # Its source is the file's, which would silently undo the other fault's edit.
        raise RuntimeError(f"{cls_name}.{method_name} was recompiled by another fault: arm them on servers of their own")
    source = textwrap.dedent(inspect.getsource(method))
    if SUM not in source:
        raise RuntimeError(f"{cls_name}.{method_name} sums no `previous_num_tokens`: not the source this fault knows")
    code = compile(source.replace(SUM, FIRST), inspect.getsourcefile(method), "exec")
    namespace: dict = {}
    exec(code, module.__dict__, namespace)  # vLLM's own source, the sum taken out
    setattr(namespace[method_name], RECOMPILED, True)
    setattr(cls, method_name, namespace[method_name])


def patch_completion(module):
    _first_choice_only(module, "OpenAIServingCompletion", "completion_stream_generator")
    return "a streamed completion's usage counts its first choice only"


def patch_chat(module):
    _first_choice_only(module, "OpenAIServingChat", "chat_completion_stream_generator")
    return "a streamed chat answer's usage counts its first choice only"


PATCHES = {
    "vllm.entrypoints.openai.completion.serving": patch_completion,
    "vllm.entrypoints.openai.chat_completion.serving": patch_chat,
}
