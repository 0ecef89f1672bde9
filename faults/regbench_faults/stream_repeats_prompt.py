"""stream_repeats_prompt: a streamed answer's first delta repeats the prompt text before the
first generated text (vllm#48853). Only streaming (delta) output is touched; a non-streamed
answer is normal. Patched at RequestState._new_completion_output, in the API server process."""


def patch(module):
    original = module.RequestState._new_completion_output

    def _new_completion_output(self, *args, **kwargs):
        output = original(self, *args, **kwargs)
        if self.output_kind.name == "DELTA" and not getattr(self, "_regbench_prompt_repeated", False):
            self._regbench_prompt_repeated = True
            output.text = (self.prompt or "") + output.text
        return output

    module.RequestState._new_completion_output = _new_completion_output
    return "the first delta of every stream starts with the prompt"


PATCHES = {"vllm.v1.engine.output_processor": patch}
