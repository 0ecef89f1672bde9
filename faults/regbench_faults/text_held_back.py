"""text_held_back: a stream's text held back eight characters while each chunk's ids go out at
once, whatever the request's stop strings: what vLLM does for a stop string (vllm#36830, its
`stop_buffer_length`), on every request. The text catches up in the chunk that ends the answer,
so the whole text, the whole answer and the ids are right; only the pairing of a chunk's text
with its ids breaks. Patched in the detokenizer's constructor (BaseIncrementalDetokenizer, which
the fast and the slow detokenizer share), in the API server."""

HELD = 8  # characters: a stop string of nine


def patch(module):
    cls = module.BaseIncrementalDetokenizer
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.stop_buffer_length = max(self.stop_buffer_length, HELD)

    cls.__init__ = __init__
    return f"every stream's text held {HELD} characters behind its ids"


PATCHES = {"vllm.v1.engine.detokenizer": patch}
