"""seed_ignored: a request's seed is ignored; it is sampled from the shared random generator like
a request without one (vllm#21310: seeds not reproducible). vLLM 0.32's TopKTopPSampler takes
each seeded request's own torch.Generator (`generators`, by batch row); the fault hands it none,
so two requests with the same seed draw different noise. Greedy requests are untouched (they
never reach the sampler's random path). Patched in the engine core, where the sampler is made."""


def _without_generators(forward):
    def forward_ignoring_seeds(self, logits, generators, k, p):
        return forward(self, logits, {}, k, p)

    return forward_ignoring_seeds


def patch(module):
    sampler = module.TopKTopPSampler
    # Each instance binds one of these in its __init__ (by platform); patched on the class first.
    for name in ("forward_native", "forward_cpu", "forward_cuda"):
        if hasattr(sampler, name):
            setattr(sampler, name, _without_generators(getattr(sampler, name)))
    return "seeded requests sample from the shared generator"


PATCHES = {"vllm.v1.sample.ops.topk_topp_sampler": patch}
