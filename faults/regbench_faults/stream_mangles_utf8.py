"""stream_mangles_utf8: a streamed answer's multi-byte characters come out as U+FFFD, while the
same answer whole is right: what a stream decoded token by token shows where a character's bytes
are split across tokens (exo#1691, vllm-mlx#109: "ď" streamed as "��"). vLLM 0.32's
detokenizer holds a split character back until it is whole; the fault replaces every non-ASCII
character of a delta (streams only) in RequestState._new_completion_output, in the API server."""


def patch(module):
    original = module.RequestState._new_completion_output

    def _new_completion_output(self, *args, **kwargs):
        output = original(self, *args, **kwargs)
        if self.output_kind.name == "DELTA" and output.text:
            output.text = "".join(c if c.isascii() else "\ufffd" for c in output.text)
        return output

    module.RequestState._new_completion_output = _new_completion_output
    return "every non-ASCII character of a streamed delta is U+FFFD"


PATCHES = {"vllm.v1.engine.output_processor": patch}
