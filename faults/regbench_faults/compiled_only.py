"""compiled_only: the model's compiled forward computes otherwise than its eager one, so a server
answers wrong with torch.compile and right with `--enforce-eager` (the class of vllm#43631: garbage
under compilation, fixed by eager mode). vLLM 0.32 gives every model class that supports
compilation its own `__call__` (`_support_torch_compile` in vllm.compilation.decorators), which
runs the compiled graph unless the class was told not to compile, and runs `forward` eagerly
then; the fault wraps the classes it decorates so that the compiled graph's hidden states come
back rotated by one feature, the way a miscompiled kernel's would, whether the graph was
compiled in this process or loaded from vLLM's compile cache. Eager servers are untouched: the
fault is dormant there. Patched in the engine core, where the model is built."""

MARK = "regbench_compiled_only"


def _rotated(out):
    import torch

    return torch.roll(out, shifts=1, dims=-1) if isinstance(out, torch.Tensor) else out


def _wrong_when_compiled(support):
    def decorate(cls, *args, **kwargs):
        cls = support(cls, *args, **kwargs)
        call = cls.__call__
        if getattr(call, MARK, False):
            return cls  # decorated twice: wrapped once

        def __call__(self, *a, **kw):
            out = call(self, *a, **kw)
            return out if self.do_not_compile else _rotated(out)

        setattr(__call__, MARK, True)
        cls.__call__ = __call__
        return cls

    return decorate


def patch(module):
    module._support_torch_compile = _wrong_when_compiled(module._support_torch_compile)
    return "a compiled model's hidden states are rotated by one feature; eager ones are untouched"


PATCHES = {"vllm.compilation.decorators": patch}
